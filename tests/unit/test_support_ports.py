"""The tests' own port claims (``tests.support.ports``): a claimed port is nobody else's
until the claim is released, and none is in the kernel's ephemeral range."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.support.ports import (
    CLAIM_PREFIX,
    claimed_ports,
    ephemeral_range,
    free_port,
    listener_ports,
    release_claims_since,
)

CLAIM_IN_ANOTHER_PROCESS = f"""
import socket, sys
claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    claim.bind("\\0{CLAIM_PREFIX}" + sys.argv[1])
except OSError:
    sys.exit(1)
sys.exit(0)
"""


def claimable_elsewhere(port: int) -> bool:
    other = subprocess.run(
        [sys.executable, "-c", CLAIM_IN_ANOTHER_PROCESS, str(port)], check=False, timeout=30
    )
    return other.returncode == 0


def test_a_claimed_port_is_nobody_elses_until_released() -> None:
    earlier = claimed_ports()
    port = free_port()

    assert port in claimed_ports()
    assert not claimable_elsewhere(port)
    release_claims_since(earlier)
    assert port not in claimed_ports()
    assert claimable_elsewhere(port)


def test_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    earlier = claimed_ports()
    low, high = ephemeral_range()
    try:
        ports = [free_port() for _ in range(50)]
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert port in listener_ports()
            assert not low <= port <= high
            with socket.socket() as listener:  # nothing listens there: it can be bound
                listener.bind(("127.0.0.1", port))
    finally:
        release_claims_since(earlier)
