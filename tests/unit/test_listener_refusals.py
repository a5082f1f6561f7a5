"""A listener's refusals are counted by reason, and each reason is logged at most once an
interval, the line saying how many went unlogged since the one before. A connection closed
for sending nothing is counted apart, and logged not at all."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from app.listeners.refusals import ListenerCollector, ListenerRefusals, RefusalReason

REFUSED_EVENT = "listener_refused"
CLIENT = ("127.0.0.7", 40000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_one_line_and_the_next_line_says_how_many_went_unlogged() -> None:
    clock = Clock()
    refusals = ListenerRefusals("client", interval_s=60.0, clock=clock)

    with capture_logs() as logs:
        for _ in range(5):
            refusals.refused(RefusalReason.CONNECTIONS, 503, CLIENT, 4)
        clock.now += 59.0
        refusals.refused(RefusalReason.CONNECTIONS, 503, CLIENT, 4)
        clock.now += 1.0
        refusals.refused(RefusalReason.CONNECTIONS, 503, None, 4)

    lines = [entry for entry in logs if entry["event"] == REFUSED_EVENT]
    assert [entry["refused_unlogged"] for entry in lines] == [0, 5]
    assert [entry["client"] for entry in lines] == ["127.0.0.7", None]
    assert refusals.totals()[RefusalReason.CONNECTIONS] == 7


def test_each_reason_is_throttled_on_its_own_and_every_reason_is_counted_from_zero() -> None:
    refusals = ListenerRefusals("admin", clock=Clock())

    with capture_logs() as logs:
        refusals.refused(RefusalReason.CONNECTIONS, 503, CLIENT, 4)
        refusals.refused(RefusalReason.MALFORMED, 400, CLIENT)
        refusals.refused(RefusalReason.MALFORMED, 400, CLIENT)

    assert [(entry["reason"], entry["log_level"]) for entry in logs] == [
        ("connections", "warning"),
        ("malformed", "warning"),
    ]
    assert logs[1]["limit"] is None
    totals = refusals.totals()
    assert set(totals) == set(RefusalReason)
    assert totals[RefusalReason.MALFORMED] == 2
    assert totals[RefusalReason.HEADER_TIMEOUT] == 0


def test_a_silent_connection_closed_is_counted_apart_from_refusals_and_not_logged() -> None:
    refusals = ListenerRefusals("client", clock=Clock())

    with capture_logs() as logs:
        refusals.closed_silent()
        refusals.closed_silent()

    assert logs == []
    assert refusals.silent_closed == 2
    assert set(refusals.totals().values()) == {0}


def test_a_kept_alive_connection_closed_when_idle_is_counted_apart_and_not_logged() -> None:
    refusals = ListenerRefusals("client", clock=Clock())

    with capture_logs() as logs:
        refusals.closed_keepalive()

    assert logs == []
    assert refusals.keepalive_closed == 1
    assert refusals.silent_closed == 0
    assert set(refusals.totals().values()) == {0}


def test_each_listener_has_its_refusals_and_its_idle_closes_from_the_start() -> None:
    client, metrics = ListenerRefusals("client"), ListenerRefusals("metrics")
    client.closed_silent()
    client.closed_keepalive()
    client.closed_keepalive()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ListenerCollector("llmgw_gateway_listener", [client, metrics]))

    page = generate_latest(registry).decode()

    assert 'llmgw_gateway_listener_idle_closed_total{listener="client"} 1.0' in page
    assert 'llmgw_gateway_listener_idle_closed_total{listener="metrics"} 0.0' in page
    assert 'llmgw_gateway_listener_keepalive_closed_total{listener="client"} 2.0' in page
    assert 'llmgw_gateway_listener_keepalive_closed_total{listener="metrics"} 0.0' in page
    assert 'llmgw_gateway_listener_refusals_total{listener="metrics",reason="connections"} 0.0' in (
        page
    )
