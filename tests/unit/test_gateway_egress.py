"""The gateway's egress check: which routes of a snapshot reach the router and the proxy.

Addresses outside 127.0.0.0/8 here are deliberate (the fixture scan allows this file):
they are only ever refused, never dialled.
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from app.domain.egress import EngineNetworks
from app.gateway.egress import EngineEgress, engine_host
from app.gateway.metrics import GatewayMetrics
from app.gateway.table import GatewaySnapshot, Route


def route(replica_id: str, url: str, agent_address: str = "", model: str = "llama") -> Route:
    return Route(replica_id=replica_id, model=model, url=url, agent_address=agent_address)


def snapshot(*routes: Route) -> GatewaySnapshot:
    by_model: dict[str, tuple[Route, ...]] = {}
    for r in routes:
        by_model[r.model] = (*by_model.get(r.model, ()), r)
    return GatewaySnapshot(declared=frozenset(by_model), routes=by_model)


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def routed(admitted: GatewaySnapshot) -> list[str]:
    return sorted(r.replica_id for routes in admitted.routes.values() for r in routes)


def test_routes_outside_the_engine_networks_are_left_out_and_counted() -> None:
    metrics = GatewayMetrics()
    egress = EngineEgress(EngineNetworks.parse("10.20.0.0/16,127.0.0.0/8"), metrics)
    given = snapshot(
        route("llama-1", "http://10.20.0.7:20001"),
        route("llama-2", "http://10.1.0.7:20001"),
        route("qwen-1", "http://192.168.0.9:20002", model="qwen"),
        route("qwen-2", "http://127.0.0.1:20003", model="qwen"),
    )

    admitted = egress.admit(given)

    assert routed(admitted) == ["llama-1", "qwen-2"]
    assert admitted.declared == given.declared  # refused models stay declared: 503, not 404
    refusals = "llmgw_gateway_engine_egress_refusals_total"
    assert sample(metrics, refusals, reason="outside_engine_networks") == 2
    assert sample(metrics, "llmgw_gateway_egress_refused_routes") == 2


def test_a_model_whose_every_route_is_refused_has_no_routes_left() -> None:
    egress = EngineEgress(EngineNetworks.parse("127.0.0.0/8"), GatewayMetrics())

    admitted = egress.admit(snapshot(route("llama-1", "http://10.1.0.7:20001")))

    assert admitted.routes == {}
    assert admitted.declared == frozenset({"llama"})


def test_each_route_is_counted_and_each_address_warned_about_once() -> None:
    metrics = GatewayMetrics()
    egress = EngineEgress(EngineNetworks.parse("127.0.0.0/8"), metrics)
    first = snapshot(
        route("llama-1", "http://10.1.0.7:20001"), route("llama-2", "http://10.1.0.7:20002")
    )
    later = snapshot(
        route("llama-1", "http://10.1.0.7:20001"),
        route("llama-2", "http://10.1.0.7:20002"),
        route("llama-3", "http://10.1.0.8:20001"),
    )

    with capture_logs() as logs:
        for _ in range(3):
            egress.admit(first)
        egress.admit(later)

    warned = [entry["address"] for entry in logs if entry["event"] == "engine_address_refused"]
    assert warned == ["10.1.0.7", "10.1.0.8"]
    assert all(entry["log_level"] == "warning" for entry in logs)
    assert "outside the engine networks 127.0.0.0/8" in logs[0]["reason"]
    refusals = "llmgw_gateway_engine_egress_refusals_total"
    assert sample(metrics, refusals, reason="outside_engine_networks") == 3
    assert sample(metrics, "llmgw_gateway_egress_refused_routes") == 3


def test_a_snapshot_with_nothing_refused_passes_as_it_is() -> None:
    metrics = GatewayMetrics()
    given = snapshot(route("llama-1", "http://127.0.0.1:20001"))

    assert EngineEgress(EngineNetworks.parse("127.0.0.0/8"), metrics).admit(given) is given
    assert sample(metrics, "llmgw_gateway_egress_refused_routes") == 0


def test_by_default_each_node_is_reached_only_at_the_address_its_agent_connected_from() -> None:
    metrics = GatewayMetrics()
    egress = EngineEgress(None, metrics)

    admitted = egress.admit(
        snapshot(
            route("llama-1", "http://10.20.0.7:20001", agent_address="10.20.0.7:51234"),
            route("llama-2", "http://10.1.0.7:20001", agent_address="10.20.0.8:51234"),
            route("llama-3", "http://127.0.0.1:20001", agent_address="127.0.0.1:51234"),
            route("llama-4", "http://127.0.0.1:20002", agent_address="10.20.0.9:51234"),
            route("llama-5", "http://[fd00:20::7]:20001", agent_address="[fd00:20::7]:5"),
            route("llama-6", "http://gpu-06.internal:20001", agent_address="10.20.0.6:5"),
            route("llama-7", "http://10.20.0.10:20001"),
        )
    )

    assert routed(admitted) == ["llama-1", "llama-3", "llama-5"]
    refusals = "llmgw_gateway_engine_egress_refusals_total"
    assert sample(metrics, refusals, reason="not_the_agent_address") == 4


def test_a_route_whose_url_is_not_plainly_http_host_port_is_refused() -> None:
    metrics = GatewayMetrics()
    egress = EngineEgress(EngineNetworks.parse("0.0.0.0/0"), metrics)

    admitted = egress.admit(
        snapshot(
            route("llama-1", "http://127.0.0.1:20001@10.1.0.7:80"),
            route("llama-2", "http://127.0.0.1:20001/v1"),
            route("llama-3", "https://127.0.0.1:20001"),
            route("llama-4", "http://127.0.0.1"),
            route("llama-5", "http://127.0.0.1:20001"),
            # Digits to str.isdigit() that int() refuses: the ValueError lost the whole
            # snapshot, every other route's change with it.
            route("llama-6", "http://127.0.0.1:²"),
        )
    )

    assert routed(admitted) == ["llama-5"]
    refusals = "llmgw_gateway_engine_egress_refusals_total"
    assert sample(metrics, refusals, reason="not_an_engine_url") == 5


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://127.0.0.1:20001", "127.0.0.1"),
        ("http://[::1]:20001", "[::1]"),
        ("http://gpu-07.internal:20001", "gpu-07.internal"),
        ("http://127.0.0.1:20001/", None),
        ("http://u:p@127.0.0.1:20001", None),
        ("http://127.0.0.1:20001?x=1", None),
        ("http://127.0.0.1:99999", None),
        ("http://127.0.0.1:²", None),
        ("http://127.0.0.1:\u0662\u0660\u0660\u0660\u0661", None),  # 20001 in Arabic-Indic digits
        ("http://:20001", None),
        ("ftp://127.0.0.1:20001", None),
    ],
)
def test_the_engine_host_of_a_route_url(url: str, host: str | None) -> None:
    assert engine_host(url) == host
