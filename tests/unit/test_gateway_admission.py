"""Admission: which replica may take a request, and which one does."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from app.gateway.admission import (
    MAX_RUNNING,
    Candidate,
    ReplicaState,
    Signals,
    assess,
    carried,
    choose,
    counted,
    is_eligible,
)
from app.gateway.table import Route

NOW = 1000.0
STALE_AFTER = 0.75


def route(replica_id: str, **settings: object) -> Route:
    return Route(replica_id=replica_id, model="m", url=f"http://{replica_id}", **settings)  # type: ignore[arg-type]


def fresh(waiting: float = 0, kv: float = 0.0, running: float = 0) -> Signals:
    return Signals(waiting=waiting, running=running, kv_usage=kv, scraped_at=NOW - 0.1)


def candidate(
    replica_id: str,
    signals: Signals | None = None,
    *,
    in_flight: int = 0,
    reserved: int = 0,
    **settings: object,
) -> Candidate:
    return Candidate(
        route=route(replica_id, **settings),
        signals=signals,
        in_flight=in_flight,
        reserved=reserved,
    )


def pick(*candidates: Candidate) -> str | None:
    chosen = choose(candidates, now=NOW, stale_after_s=STALE_AFTER)
    return None if chosen is None else chosen.route.replica_id


def test_a_replica_at_its_waiting_target_or_kv_ceiling_takes_nothing() -> None:
    assert pick(candidate("a", fresh(waiting=5), target_waiting=5)) is None
    assert pick(candidate("a", fresh(waiting=4), target_waiting=5)) == "a"
    assert pick(candidate("a", fresh(kv=0.8), kv_ceiling=0.8)) is None
    assert pick(candidate("a", fresh(kv=0.79), kv_ceiling=0.8)) == "a"


def test_the_gateways_own_reservations_count_as_waiting() -> None:
    assert pick(candidate("a", fresh(waiting=3), reserved=2, target_waiting=5)) is None
    assert pick(candidate("a", fresh(waiting=3), reserved=1, target_waiting=5)) == "a"


def test_the_least_loaded_relative_to_its_limits_wins() -> None:
    queue_bound = candidate("queue", fresh(waiting=3), target_waiting=4)  # 0.75
    kv_bound = candidate("kv", fresh(waiting=0, kv=0.4), kv_ceiling=0.8)  # 0.5
    assert pick(queue_bound, kv_bound) == "kv"


def test_weight_scales_the_load() -> None:
    light = candidate("light", fresh(waiting=1), target_waiting=4)  # 0.25 / 1
    heavy = candidate("heavy", fresh(waiting=2), target_waiting=4, weight=4.0)  # 0.5 / 4
    assert pick(light, heavy) == "heavy"


def test_ties_go_to_the_fewest_in_flight_per_weight() -> None:
    busy = candidate("busy", fresh(), in_flight=3)
    idle = candidate("idle", fresh(), in_flight=1)
    assert pick(busy, idle) == "idle"
    assert pick(busy, candidate("big", fresh(), in_flight=4, weight=2.0)) == "big"


def test_draining_replicas_only_when_nothing_else_is_eligible() -> None:
    draining = candidate("old", fresh(), draining=True)
    loaded = candidate("new", fresh(waiting=4), target_waiting=5)
    assert pick(draining, loaded) == "new"
    full = candidate("new", fresh(waiting=5), target_waiting=5)
    assert pick(draining, full) == "old"


def test_stale_or_missing_signals_are_judged_by_in_flight_alone() -> None:
    old = Signals(waiting=99, running=0, kv_usage=1.0, scraped_at=NOW - 10)
    # Last known saturated, but stale: the in-flight count decides.
    assert pick(candidate("a", old, in_flight=9, target_waiting=5)) == "a"
    assert pick(candidate("a", old, in_flight=10, target_waiting=5)) is None
    assert pick(candidate("a", None, in_flight=9, target_waiting=5)) == "a"
    assert pick(candidate("a", None, in_flight=10, target_waiting=5)) is None


def test_a_target_below_one_still_takes_work() -> None:
    assert pick(candidate("a", fresh(), target_waiting=0)) == "a"
    assert pick(candidate("a", None, target_waiting=0)) == "a"


def test_a_burst_before_the_next_scrape_is_spread_by_reservations() -> None:
    states = [ReplicaState(route(name, target_waiting=2)) for name in ("a", "b")]
    for state in states:
        state.signals = fresh()
    sent: Counter[str] = Counter()
    for request in range(5):
        chosen = choose(states, now=NOW, stale_after_s=STALE_AFTER)
        if chosen is None:
            break
        chosen.in_flight += 1
        chosen.reserve(request)
        sent[chosen.route.replica_id] += 1
    assert sent == {"a": 2, "b": 2}


def test_a_reservation_is_absorbed_by_the_second_scrape_after_it() -> None:
    state = ReplicaState(route("a"))
    state.begin_scrape()
    state.reserve("request")
    first = state.begin_scrape()
    state.absorb_reservations(first)
    assert state.reserved == 1  # this scrape may have left before the request did
    second = state.begin_scrape()
    state.absorb_reservations(second)
    assert state.reserved == 0
    assert not state.unreserve("request")


# -- properties ------------------------------------------------------------------------------

signals_st = st.one_of(
    st.none(),
    st.builds(
        Signals,
        waiting=st.integers(0, 20).map(float),
        running=st.integers(0, 20).map(float),
        kv_usage=st.floats(0, 1),
        scraped_at=st.floats(NOW - 5, NOW),
    ),
)


@st.composite
def candidates_st(draw: st.DrawFn) -> list[Candidate]:
    count = draw(st.integers(0, 6))
    result = []
    for index in range(count):
        in_flight = draw(st.integers(0, 20))
        result.append(
            candidate(
                f"r{index}",
                draw(signals_st),
                in_flight=in_flight,
                reserved=draw(st.integers(0, in_flight)),
                weight=draw(st.floats(0.1, 10)),
                target_waiting=draw(st.integers(0, 10)),
                kv_ceiling=draw(st.floats(0.05, 1)),
                draining=draw(st.booleans()),
            )
        )
    return result


@settings(max_examples=200)
@given(candidates_st())
def test_choice_is_eligible_preferred_and_least_loaded(candidates: list[Candidate]) -> None:
    eligible = [c for c in candidates if is_eligible(c, now=NOW, stale_after_s=STALE_AFTER)]
    chosen = choose(candidates, now=NOW, stale_after_s=STALE_AFTER)
    if not eligible:
        assert chosen is None
        return
    assert chosen in eligible
    if any(not c.route.draining for c in eligible):
        assert not chosen.route.draining
    ranks = [assess(c, now=NOW, stale_after_s=STALE_AFTER) for c in eligible]
    assert assess(chosen, now=NOW, stale_after_s=STALE_AFTER) == min(r for r in ranks if r)


@settings(max_examples=200)
@given(candidates_st())
def test_an_eligible_replica_is_below_its_limits(candidates: list[Candidate]) -> None:
    for c in candidates:
        rank = assess(c, now=NOW, stale_after_s=STALE_AFTER)
        if rank is not None:
            _, load_per_weight, _ = rank
            assert load_per_weight * c.route.weight < 1.0 + 1e-9


def test_max_in_flight_bounds_a_replica_by_the_gateways_own_count_whatever_its_signals() -> None:
    # Fresh signals with room, and the replica still takes nothing at the bound.
    at_bound = candidate("a", fresh(waiting=0), in_flight=2)
    below = candidate("a", fresh(waiting=0), in_flight=1)
    assert assess(at_bound, now=NOW, stale_after_s=STALE_AFTER, max_in_flight=2) is None
    assert assess(below, now=NOW, stale_after_s=STALE_AFTER, max_in_flight=2) is not None
    assert assess(at_bound, now=NOW, stale_after_s=STALE_AFTER) is not None
    # Stale signals: the bound is the lower of the two limits.
    stale = candidate("a", None, in_flight=3, target_waiting=5)
    assert is_eligible(stale, now=NOW, stale_after_s=STALE_AFTER)
    assert not is_eligible(stale, now=NOW, stale_after_s=STALE_AFTER, max_in_flight=3)


def test_max_in_flight_sends_the_request_to_a_replica_with_room() -> None:
    full = candidate("a", fresh(waiting=0), in_flight=2, weight=10.0)
    room = candidate("b", fresh(waiting=3), in_flight=1)
    assert pick(full, room) == "a"
    chosen = choose([full, room], now=NOW, stale_after_s=STALE_AFTER, max_in_flight=2)
    assert chosen is room
    assert choose([full], now=NOW, stale_after_s=STALE_AFTER, max_in_flight=2) is None


def test_a_running_count_no_replica_can_hold_adds_nothing_to_its_models_total() -> None:
    # Believed, an engine's billion running requests raised the bound of every other
    # replica of its model's keyed routing; its own load still says it is full.
    times = {"now": NOW, "stale_after_s": STALE_AFTER}
    for running in (1e9, MAX_RUNNING + 1.0):
        liar = candidate("r-1", fresh(waiting=2, running=running), reserved=1)
        assert counted(liar, **times) == 3.0
        assert carried(liar, **times) == running + 3.0
    busy = candidate("r-2", fresh(waiting=2, running=MAX_RUNNING))
    assert counted(busy, **times) == MAX_RUNNING + 2.0
