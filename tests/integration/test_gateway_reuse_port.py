"""Several gateway processes on one port (``--reuse-port``): each binds the port with
``SO_REUSEPORT`` and the kernel spreads new connections among them; without it the second
is refused with the listener and the reason named. Two gateways on two loops of this
process stand in for two processes: the socket option is what is tested, and the kernel
treats both alike (``benchmarks/gateway.py --gateway-processes 2`` runs real processes)."""

from __future__ import annotations

import httpx
import pytest

from app.gateway.postgres import GatewayOptions
from app.gateway.server import GatewayFailed, StaticSource
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port

CONNECTIONS = 40
"""The chance that the kernel hashes all of them to one of two listeners is 2^-39."""


def models_seen(base_url: str, key: str) -> set[str]:
    """The models ``/v1/models`` lists, over ``CONNECTIONS`` new connections."""
    seen: set[str] = set()
    for _ in range(CONNECTIONS):
        with httpx.Client(base_url=base_url, timeout=10) as client:
            answer = client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
            answer.raise_for_status()
            seen.update(entry["id"] for entry in answer.json()["data"])
    return seen


def test_gateways_sharing_a_port_each_take_connections() -> None:
    key, record = new_key()
    port = free_port()
    first = StaticSource(snapshot_of([], [record], declared=frozenset({"first"})))
    second = StaticSource(snapshot_of([], [record], declared=frozenset({"second"})))
    with (
        GatewayThread(first, port=port, reuse_port=True) as one,
        GatewayThread(second, port=port, reuse_port=True) as other,
    ):
        assert one.gateway.port == other.gateway.port == port
        assert models_seen(one.base_url, key) == {"first", "second"}


def test_without_reuse_port_a_second_gateway_on_the_port_is_refused_by_name() -> None:
    _, record = new_key()
    port = free_port()
    source = StaticSource(snapshot_of([], [record]))
    second = GatewayThread(StaticSource(snapshot_of([], [record])), port=port)
    with (
        GatewayThread(source, port=port, reuse_port=True),
        pytest.raises(GatewayFailed, match=rf"the gateway cannot listen on .*:{port}"),
        second,
    ):
        pass


def test_reuse_port_needs_a_fixed_port() -> None:
    assert GatewayOptions(port=0, reuse_port=True).problems() == [
        "--reuse-port needs a fixed --port for the processes to share"
    ]
    assert GatewayOptions(port=8080, reuse_port=True).problems() == []
