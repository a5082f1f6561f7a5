"""Loopback ports for the listeners tests start, safe with several test processes at once
(``pytest -n``'s workers, or another checkout's session on the same machine).

A port the kernel picks (bind to port 0, then close) is free only at that instant: until the
child process binds it, the kernel may hand it to anyone else, as another probe's answer or
as the local port of an outgoing connection. So tests take ports from outside the kernel's
ephemeral range instead, where nothing is handed out automatically, and claim each one as
``llmgw-dev`` claims its engine port blocks (``devcluster.ports``): with an abstract Unix
socket named after it, which no other process can bind meanwhile, and which the kernel
releases however the process ends. A port is taken only while it is claimed by nobody and
nothing holds it: no listener, and no connection in TIME_WAIT (which a listener without
``SO_REUSEADDR`` could not bind over), as the kernel's own choice would be.

A claim lasts until the test that made it ends (``release_claims_since``, called by an
autouse fixture): the test's processes are gone by then. Claims made by module or session
fixtures last until the process ends. A claimed port nobody binds is a port where nobody
listens, for tests that need one (connection refused).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from devcluster.ports import LOOPBACK, claim_name

CLAIM_PREFIX = "llmgw-test-port-"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
HIGHEST_PORT = 65535
LOWEST_TEST_PORT = 31000
"""Below it: the engine ports of test clusters (10000-29999) and of ``llmgw-dev``
(21000-30999), whose agents find out for themselves whether a port is taken."""
MIN_TEST_PORTS = 1000

_claims: dict[int, socket.socket] = {}
_rng = random.Random()


def free_port() -> int:
    """A loopback port claimed by this process, on which nothing listens now."""
    candidates = listener_ports()
    for _ in range(len(candidates)):
        port = _rng.choice(candidates)
        if port in _claims:
            continue
        claim = _claim(port)
        if claim is None:
            continue
        if nothing_holds(port):
            _claims[port] = claim
            return port
        claim.close()
    raise RuntimeError(
        f"no free port in {candidates[0]}-{candidates[-1]}: every one is claimed or in use"
    )


def nothing_holds(port: int) -> bool:
    """Whether a listener could bind ``port`` now, with or without ``SO_REUSEADDR``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def claimed_ports() -> frozenset[int]:
    return frozenset(_claims)


def release_claims_since(earlier: frozenset[int]) -> None:
    """Release every claim made since ``claimed_ports()`` answered ``earlier``."""
    for port in set(_claims) - earlier:
        _claims.pop(port).close()


def listener_ports() -> range:
    """Ports outside the kernel's ephemeral range: above it, else below it (not under
    ``LOWEST_TEST_PORT``)."""
    low, high = ephemeral_range()
    above = range(max(high + 1, LOWEST_TEST_PORT), HIGHEST_PORT + 1)
    below = range(LOWEST_TEST_PORT, low)
    chosen = max(above, below, key=len)
    if len(chosen) < MIN_TEST_PORTS:
        raise RuntimeError(
            f"the ephemeral port range {low}-{high} leaves fewer than {MIN_TEST_PORTS} ports "
            f"from {LOWEST_TEST_PORT} up for the tests' listeners; narrow it in "
            f"{EPHEMERAL_RANGE_FILE}"
        )
    return chosen


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(field) for field in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def _claim(port: int) -> socket.socket | None:
    return claim_name(f"{CLAIM_PREFIX}{port}")


__all__ = ["claimed_ports", "free_port", "listener_ports", "nothing_holds", "release_claims_since"]
