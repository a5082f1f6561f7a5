"""Passive health: a replica that fails requests in a row is ejected from the gateway's
rotation for a cool-off that doubles with each ejection in a row, then probed back in by
one request. Timing runs on a fixed clock that the tests move by hand."""

from __future__ import annotations

import uuid

import pytest
from structlog.testing import capture_logs

from app.gateway.ejection import EjectionPolicy, Ejector, Ticket
from app.gateway.metrics import GatewayMetrics
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, Route

MODEL = "m"
POLICY = EjectionPolicy(consecutive_failures=3, base_cool_off_s=5.0, max_cool_off_s=40.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ejector_of(*replicas: str, policy: EjectionPolicy = POLICY) -> tuple[Ejector, FakeClock]:
    clock = FakeClock()
    ejector = Ejector(policy, clock)
    ejector.track({MODEL: replicas})
    return ejector, clock


def fail(ejector: Ejector, replica_id: str, times: int = 1) -> None:
    for _ in range(times):
        ejector.failed(replica_id, ejector.granted(replica_id), "unreachable")


def succeed(ejector: Ejector, replica_id: str) -> Ticket:
    ticket = ejector.granted(replica_id)
    ejector.succeeded(replica_id, ticket)
    return ticket


def out(ejector: Ejector) -> list[str]:
    return [e.replica_id for e in ejector.ejected()]


def test_a_replica_is_ejected_at_the_nth_failure_in_a_row_with_a_log_line() -> None:
    ejector, _ = ejector_of("a", "b", "c")
    fail(ejector, "a", 2)
    assert out(ejector) == []
    assert ejector.shunned(MODEL) == frozenset()
    with capture_logs() as logs:
        fail(ejector, "a")
    assert out(ejector) == ["a"]
    assert ejector.shunned(MODEL) == {"a"}
    assert logs == [
        {
            "event": "replica_ejected",
            "log_level": "warning",
            "replica_id": "a",
            "model": MODEL,
            "failures": 3,
            "reason": "unreachable",
            "ejections": 1,
            "cool_off_s": 5.0,
        }
    ]
    assert ejector.ejections_total() == {("a", MODEL): 1}


def test_a_success_resets_the_count_of_failures_in_a_row() -> None:
    ejector, _ = ejector_of("a", "b")
    for _ in range(3):
        fail(ejector, "a", 2)
        succeed(ejector, "a")
    assert out(ejector) == []
    fail(ejector, "a", 3)
    assert out(ejector) == ["a"]


def test_the_cool_off_doubles_with_each_ejection_in_a_row_and_one_probe_goes_at_its_end() -> None:
    ejector, clock = ejector_of("a", "b")
    fail(ejector, "a", 3)
    ejected_at = clock.now
    for cool_off_s in (5.0, 10.0, 20.0, 40.0, 40.0):  # capped at max_cool_off_s
        clock.now = ejected_at + cool_off_s - 0.001
        assert ejector.shunned(MODEL) == {"a"}, cool_off_s
        assert not ejector.granted("a").probe  # a lease granted anyway is no probe
        clock.now = ejected_at + cool_off_s
        assert ejector.shunned(MODEL) == frozenset(), "on probation: one request goes"
        assert [e.probation for e in ejector.ejected()] == [True]
        probe = ejector.granted("a")
        assert probe.probe
        assert ejector.shunned(MODEL) == {"a"}, "one probe at a time"
        assert not ejector.granted("a").probe
        with capture_logs() as logs:
            ejector.failed("a", probe, "HTTP 500")
        longer_s = min(cool_off_s * 2, 40.0)
        assert [(e["event"], e["cool_off_s"]) for e in logs] == [("replica_ejected", longer_s)]
        ejected_at = clock.now
    clock.now = ejected_at + 40.0
    probe = ejector.granted("a")
    with capture_logs() as logs:
        ejector.succeeded("a", probe)
    assert logs == [
        {
            "event": "replica_returned",
            "log_level": "info",
            "replica_id": "a",
            "model": MODEL,
            "ejections": 6,
            "out_s": 5.0 + 10 + 20 + 40 + 40 + 40,
        }
    ]
    assert out(ejector) == []
    assert ejector.shunned(MODEL) == frozenset()
    assert ejector.ejections_total() == {("a", MODEL): 6}


def test_ejections_in_a_row_are_forgotten_once_the_replica_stayed_in_rotation_long_enough() -> None:
    ejector, clock = ejector_of("a", "b")
    fail(ejector, "a", 3)
    clock.now += 5.0
    ejector.failed("a", ejector.granted("a"), "unreachable")  # the probe fails: 10 s
    clock.now += 10.0
    ejector.succeeded("a", ejector.granted("a"))
    clock.now += 39.0  # back for less than max_cool_off_s: the next cool-off is 20 s
    with capture_logs() as logs:
        fail(ejector, "a", 3)
    assert logs[0]["cool_off_s"] == 20.0
    clock.now += 20.0
    ejector.succeeded("a", ejector.granted("a"))
    clock.now += 40.0  # back for max_cool_off_s: start over at 5 s
    with capture_logs() as logs:
        fail(ejector, "a", 3)
    assert (logs[0]["cool_off_s"], logs[0]["ejections"]) == (5.0, 1)


def test_a_probe_whose_client_left_lets_the_next_request_probe() -> None:
    ejector, clock = ejector_of("a", "b")
    fail(ejector, "a", 3)
    clock.now += 5.0
    probe = ejector.granted("a")
    assert ejector.shunned(MODEL) == {"a"}
    ejector.abandoned("a", probe)
    assert ejector.shunned(MODEL) == frozenset()
    assert ejector.granted("a").probe


def test_a_verdict_counts_once_and_only_for_leases_of_the_current_run() -> None:
    ejector, clock = ejector_of("a", "b")
    before = [ejector.granted("a") for _ in range(5)]  # in flight when it is ejected
    fail(ejector, "a", 3)
    for ticket in before:  # they end during the cool-off, and say nothing more
        ejector.succeeded("a", ticket)
    assert out(ejector) == ["a"]
    clock.now += 5.0
    probe = ejector.granted("a")
    ejector.succeeded("a", probe)
    ejector.failed("a", probe, "late")  # a second verdict of one lease is ignored
    ejector.abandoned("a", probe)
    assert out(ejector) == []
    stale = ejector.granted("a")
    ejector.succeeded("a", stale)
    fail(ejector, "a", 2)
    ejector.failed("a", stale, "again")  # settled already: not a third failure
    assert out(ejector) == []


@pytest.mark.parametrize(
    ("replicas", "percent", "ejectable"),
    [(1, 50, 0), (2, 50, 1), (3, 50, 1), (4, 50, 2), (5, 50, 2), (4, 100, 3), (4, 10, 1),
     (10, 10, 1), (20, 10, 2), (4, 0, 0)],
)  # fmt: skip
def test_at_most_a_share_of_a_models_replicas_is_ejected_and_never_the_last(
    replicas: int, percent: int, ejectable: int
) -> None:
    ids = [f"r{n}" for n in range(replicas)]
    ejector, _ = ejector_of(
        *ids, policy=EjectionPolicy(consecutive_failures=2, max_ejected_percent=percent)
    )
    with capture_logs() as logs:
        for replica_id in ids:
            fail(ejector, replica_id, 5)
    assert out(ejector) == ids[:ejectable]
    capped = [e for e in logs if e["event"] == "replica_ejection_capped"]
    assert [e["replica_id"] for e in capped] == ids[ejectable:], "logged once per run"
    assert all(e["max_ejected"] == ejectable for e in capped)


def test_a_capped_replica_is_ejected_at_its_next_failure_once_there_is_room() -> None:
    ejector, clock = ejector_of("a", "b")
    fail(ejector, "a", 3)
    fail(ejector, "b", 4)
    assert out(ejector) == ["a"]
    clock.now += 5.0
    ejector.succeeded("a", ejector.granted("a"))
    fail(ejector, "b")
    assert out(ejector) == ["b"]


def test_other_models_replicas_do_not_count_against_the_cap() -> None:
    ejector = Ejector(POLICY, FakeClock())
    ejector.track({"x": ["x1", "x2"], "y": ["y1", "y2"]})
    fail(ejector, "x1", 3)
    fail(ejector, "y1", 3)
    assert out(ejector) == ["x1", "y1"]
    assert ejector.shunned("x") == {"x1"}
    assert ejector.shunned("y") == {"y1"}


def test_when_only_ejected_replicas_are_left_they_are_all_routed_to() -> None:
    ejector, _ = ejector_of("a", "b", "c")
    fail(ejector, "a", 3)
    assert ejector.shunned(MODEL) == {"a"}
    assert ejector.shunned(MODEL, exclude=frozenset({"b"})) == {"a"}
    # A retry that excludes every replica in rotation may go to the ejected one.
    assert ejector.shunned(MODEL, exclude=frozenset({"b", "c"})) == frozenset()
    ejector.track({MODEL: ["a"]})  # the others left the routing table
    assert ejector.shunned(MODEL) == frozenset()
    ejector.track({MODEL: ["b"]})  # and a replica that leaves it is forgotten
    assert out(ejector) == []
    assert ejector.ejections_total() == {}


def test_zero_failures_turns_ejection_off() -> None:
    ejector, _ = ejector_of("a", "b", policy=EjectionPolicy(consecutive_failures=0))
    fail(ejector, "a", 100)
    assert out(ejector) == []


def test_the_policys_problems_name_the_flags() -> None:
    assert EjectionPolicy().problems() == []
    problems = EjectionPolicy(
        consecutive_failures=-1, base_cool_off_s=0, max_cool_off_s=-1, max_ejected_percent=101
    ).problems()
    assert [p.split(" ")[0] for p in problems] == [
        "--eject-after-failures",
        "--ejection-cool-off",
        "--max-ejection-cool-off",
        "--max-ejected-percent",
    ]
    assert EjectionPolicy(base_cool_off_s=10, max_cool_off_s=5).problems() == [
        "--max-ejection-cool-off (5) must be at least --ejection-cool-off (10)"
    ]


@pytest.mark.parametrize("seconds", [86400.5, 1e308])
def test_a_cool_off_longer_than_a_day_is_refused_by_its_flag(seconds: float) -> None:
    """As the gateway's scrape and refresh intervals: a replica ejected for 1e308 s would
    never be probed again."""
    assert EjectionPolicy(max_cool_off_s=seconds).problems() == [
        f"--max-ejection-cool-off must be at most 86400 seconds, not {seconds:g}"
    ]
    assert EjectionPolicy(base_cool_off_s=seconds, max_cool_off_s=seconds).problems() == [
        f"--ejection-cool-off must be at most 86400 seconds, not {seconds:g}",
        f"--max-ejection-cool-off must be at most 86400 seconds, not {seconds:g}",
    ]
    assert EjectionPolicy(max_cool_off_s=86400).problems() == []


# -- through the router ------------------------------------------------------------------


def route(replica_id: str) -> Route:
    return Route(replica_id=replica_id, model=MODEL, url=f"http://{replica_id}")


def router_of(*replica_ids: str) -> tuple[Router, FakeClock]:
    clock = FakeClock()
    router = Router(clock=clock, ejection=POLICY)
    routes = tuple(route(r) for r in replica_ids)
    router.update(GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: routes}))
    return router, clock


def key() -> str:
    return f"key-{uuid.uuid4().hex[:8]}"


async def test_the_router_passes_over_an_ejected_replica_until_its_probe_succeeds() -> None:
    router, clock = router_of("a", "b")
    for _ in range(3):
        lease = await router.acquire(MODEL, key(), exclude=frozenset({"b"}))
        assert lease.route.replica_id == "a"
        lease.failed("unreachable")
        lease.release()
    leases = [await router.acquire(MODEL, key()) for _ in range(4)]
    assert {lease.route.replica_id for lease in leases} == {"b"}
    # A retry that already failed on b may still go to a: better than no replica.
    retry = await router.acquire(MODEL, key(), exclude=frozenset({"b"}))
    assert retry.route.replica_id == "a"
    assert not retry.probe
    retry.release()
    clock.now += 5.0
    probe = await router.acquire(MODEL, key())  # a is idle, b has four: a is chosen
    assert (probe.route.replica_id, probe.probe) == ("a", True)
    more = await router.acquire(MODEL, key())
    assert more.route.replica_id == "b", "one probe at a time"
    probe.succeeded()
    probe.release()
    assert router.ejector.ejected() == []
    assert (await router.acquire(MODEL, key())).route.replica_id == "a"


async def test_a_probe_released_without_a_verdict_lets_the_next_request_probe() -> None:
    router, clock = router_of("a", "b")
    for _ in range(3):
        lease = await router.acquire(MODEL, key(), exclude=frozenset({"b"}))
        lease.failed("HTTP 502")
        lease.release()
    clock.now += 5.0
    probe = await router.acquire(MODEL, key())
    assert probe.probe
    probe.release()  # its client left
    again = await router.acquire(MODEL, key())
    assert (again.route.replica_id, again.probe) == ("a", True)


def test_metrics_show_each_routed_replicas_ejection_and_the_ejections_counted() -> None:
    router, _ = router_of("a", "b")
    metrics = GatewayMetrics()
    metrics.watch_ejections(router.ejector)
    fail(router.ejector, "a", 3)
    page = metrics.render().decode()
    assert 'llmgw_gateway_replica_ejected{model="m",replica="a"} 1.0' in page
    assert 'llmgw_gateway_replica_ejected{model="m",replica="b"} 0.0' in page
    assert 'llmgw_gateway_replica_ejections_total{model="m",replica="a"} 1.0' in page
    assert 'replica="b"} 1.0' not in page.split("llmgw_gateway_replica_ejections_total")[-1]
