"""A model starting from zero: the router holds its requests until a replica routes.

Given a model with an autoscaling policy (a cold-start timeout in the snapshot) and no
route, a request waits in the model's fair queue instead of failing, is served by the first
routing table with a replica of it, or ends in ``ColdStartTimedOut`` after the timeout. A
model without the policy fails at once, as always. A model the snapshot shows failing to
start (in failure backoff, no replica starting) is refused at once until its backoff
ends, and the requests held for it when that shows are refused so too. No scrapers run
here, so a replica is judged by the gateway's own in-flight count (two requests at
``target_waiting`` 1).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from app.gateway.lease import Lease
from app.gateway.route_refusals import (
    ColdStartTimedOut,
    FailingToStart,
    GatewayStopping,
    ModelRemoved,
    NoServingReplica,
    Saturated,
    cold_start_retry_after_s,
)
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, Route, StartFailure
from tests.support.requests_left import cancel_left
from tests.support.waiting import wait_until

MODEL = "m"
OTHER = "plain"
HOLD_S = 30.0

_started: list[asyncio.Task[Lease]] = []


@pytest.fixture(autouse=True)
async def _no_request_left_waiting() -> AsyncIterator[None]:
    yield
    await cancel_left(_started)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def route(replica_id: str, *, model: str = MODEL, **settings: object) -> Route:
    return Route(replica_id=replica_id, model=model, url=f"http://{replica_id}", **settings)  # type: ignore[arg-type]


def snapshot(
    *routes: Route,
    cold_start_s: dict[str, float] | None = None,
    start_failures: dict[str, StartFailure] | None = None,
    scaled_to_zero: frozenset[str] = frozenset(),
) -> GatewaySnapshot:
    """``MODEL`` and ``OTHER`` declared; ``MODEL`` with a cold-start timeout of ``HOLD_S``
    unless ``cold_start_s`` says otherwise."""
    by_model: dict[str, tuple[Route, ...]] = {}
    for one in routes:
        by_model[one.model] = (*by_model.get(one.model, ()), one)
    return GatewaySnapshot(
        declared=frozenset({MODEL, OTHER}),
        routes=by_model,
        cold_start_s={MODEL: HOLD_S} if cold_start_s is None else cold_start_s,
        start_failures=start_failures or {},
        scaled_to_zero=scaled_to_zero,
    )


class Holds:
    """A router and what it told its ``on_hold`` listener."""

    def __init__(self, *routes: Route, **options: object) -> None:
        self.router = Router(**options)  # type: ignore[arg-type]
        self.wakes = 0
        self.router.on_hold(self.wake)
        self.router.update(snapshot(*routes))

    def wake(self) -> None:
        self.wakes += 1

    def hold(self, key_id: str | None = None) -> asyncio.Task[Lease]:
        task = asyncio.create_task(self.router.acquire(MODEL, key_id or key()))
        _started.append(task)
        return task

    async def until_held(self, count: int) -> None:
        await wait_until(
            lambda: self.router.queued() == ({MODEL: count} if count else {}),
            what=f"{count} requests held",
        )


def key() -> str:
    return f"key-{uuid.uuid4().hex[:8]}"


async def until_length(items: list[str], length: int) -> None:
    await wait_until(lambda: len(items) == length, what=f"{length} items")


async def test_a_request_is_held_until_a_table_with_a_replica_arrives_then_served() -> None:
    clock = FakeClock()
    holds = Holds(clock=clock)
    held = holds.hold()
    await holds.until_held(1)
    assert holds.wakes == 1  # the gateway reports the demand at once

    clock.now += 12.5
    holds.router.update(snapshot(route("m-1")))

    lease = await held
    assert lease.route.replica_id == "m-1"
    assert lease.queued_s == pytest.approx(12.5)
    assert holds.router.queued() == {}
    assert holds.router.in_flight() == {"m-1": 1}
    assert holds.router.cold_start_holds() == {(MODEL, "served"): 1}


async def test_the_listener_is_told_once_per_wake_not_once_per_request() -> None:
    holds = Holds()
    first = [holds.hold() for _ in range(3)]
    await holds.until_held(3)
    assert holds.wakes == 1

    holds.router.update(snapshot(route("m-1")))
    await asyncio.gather(*first)
    holds.router.update(snapshot())  # scaled to zero again
    later = holds.hold()
    await holds.until_held(1)
    assert holds.wakes == 2
    later.cancel()
    with pytest.raises(asyncio.CancelledError):
        await later


async def test_no_replica_within_the_timeout_is_a_cold_start_timeout_with_a_retry_after() -> None:
    holds = Holds()
    holds.router.update(snapshot(cold_start_s={MODEL: 0.2}))

    with pytest.raises(ColdStartTimedOut) as raised:
        await holds.router.acquire(MODEL, key())

    error = raised.value
    assert (error.model, error.timeout_s, error.retry_after_s) == (MODEL, 0.2, 1.0)
    assert holds.router.queued() == {}
    assert holds.router.cold_start_holds() == {(MODEL, "timed_out"): 1}


def test_retry_after_a_cold_start_timeout_is_a_tenth_of_it_within_1_and_30_s() -> None:
    assert cold_start_retry_after_s(0.2) == 1.0
    assert cold_start_retry_after_s(50) == 5.0
    assert cold_start_retry_after_s(300) == 30.0
    assert cold_start_retry_after_s(3600) == 30.0


async def test_a_model_without_an_autoscaling_policy_still_fails_at_once() -> None:
    holds = Holds(route("o-1", model=OTHER))
    holds.router.update(snapshot())  # OTHER lost its replica; MODEL has a policy, it none

    with pytest.raises(NoServingReplica):
        await asyncio.wait_for(holds.router.acquire(OTHER, key()), timeout=1.0)
    assert holds.router.queued() == {}
    assert holds.wakes == 0


async def test_with_a_replica_the_policy_changes_nothing_a_retry_excluding_it_fails() -> None:
    holds = Holds(route("m-1"))
    with pytest.raises(NoServingReplica):
        await asyncio.wait_for(holds.router.acquire(MODEL, key(), frozenset({"m-1"})), 1.0)
    lease = await holds.router.acquire(MODEL, key())
    assert (lease.route.replica_id, lease.queued_s) == ("m-1", 0.0)
    assert holds.router.cold_start_holds() == {}


async def test_held_requests_are_served_round_robin_across_keys() -> None:
    holds = Holds()
    order: list[str] = []

    def served_to(name: str) -> Callable[[asyncio.Task[Lease]], None]:
        return lambda _: order.append(name)

    tasks = []
    for name in ("greedy", "greedy", "greedy", "modest"):
        task = holds.hold(name)
        task.add_done_callback(served_to(name))
        tasks.append(task)
        await holds.until_held(len(tasks))

    holds.router.update(snapshot(route("m-1", target_waiting=1)))  # room for two
    await until_length(order, 2)
    assert order == ["greedy", "modest"]
    assert holds.router.queued() == {MODEL: 2}
    tasks[0].result().release()
    await until_length(order, 3)
    tasks[3].result().release()
    await until_length(order, 4)
    assert order == ["greedy", "modest", "greedy", "greedy"]


async def test_held_requests_count_against_the_queue_limit() -> None:
    holds = Holds(queue_limit=2)
    held = [holds.hold(), holds.hold()]
    await holds.until_held(2)

    with pytest.raises(Saturated) as raised:
        await asyncio.wait_for(holds.router.acquire(MODEL, key()), timeout=1.0)
    assert raised.value.starting
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_a_key_flooding_a_model_at_zero_gives_up_its_newest_hold_to_another_key() -> None:
    holds = Holds(queue_limit=2)
    flood = [holds.hold("flooding"), holds.hold("flooding")]
    await holds.until_held(2)

    other = holds.hold("other")

    with pytest.raises(Saturated) as raised:
        await flood[1]
    assert raised.value.starting  # answered as a full queue of a model at zero answers
    await holds.until_held(2)
    assert not other.done()
    assert not flood[0].done()
    assert holds.router.cold_start_holds() == {(MODEL, "failed"): 1}


async def test_a_client_that_leaves_while_held_leaves_the_queue() -> None:
    holds = Holds()
    gone, staying = holds.hold(), holds.hold()
    await holds.until_held(2)

    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert holds.router.queued() == {MODEL: 1}

    holds.router.update(snapshot(route("m-1")))
    assert (await staying).route.replica_id == "m-1"
    assert holds.router.in_flight() == {"m-1": 1}
    assert holds.router.cold_start_holds() == {(MODEL, "cancelled"): 1, (MODEL, "served"): 1}


async def test_a_held_request_whose_model_loses_its_policy_is_told_there_is_no_replica() -> None:
    holds = Holds()
    held = holds.hold()
    await holds.until_held(1)

    holds.router.update(snapshot(cold_start_s={}))

    with pytest.raises(NoServingReplica):
        await held
    assert holds.router.queued() == {}
    assert holds.router.cold_start_holds() == {(MODEL, "failed"): 1}


async def test_a_held_request_whose_model_is_removed_is_told_the_model_is_gone() -> None:
    """Not that it has no replica right now (a 503 to retry): the model will not be served,
    as a new request for it is told (404)."""
    holds = Holds()
    held = holds.hold()
    await holds.until_held(1)

    holds.router.update(GatewaySnapshot(declared=frozenset({OTHER}), routes={}, cold_start_s={}))

    with pytest.raises(ModelRemoved):
        await held
    assert holds.router.queued() == {}


async def test_a_replica_that_comes_without_room_in_time_ends_the_hold_as_saturated() -> None:
    holds = Holds()
    holds.router.update(snapshot(cold_start_s={MODEL: 0.3}))
    held = [holds.hold() for _ in range(3)]
    await holds.until_held(3)

    holds.router.update(snapshot(route("m-1", target_waiting=1), cold_start_s={MODEL: 0.3}))

    results = await asyncio.gather(*held, return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["Lease", "Lease", "Saturated"]
    assert holds.router.cold_start_holds() == {(MODEL, "served"): 2, (MODEL, "timed_out"): 1}


async def test_waiters_of_a_model_that_loses_its_last_replica_are_held_past_the_queue_timeout() -> (
    None
):
    holds = Holds(route("m-1", target_waiting=1), queue_timeout_s=0.2)
    full = [await holds.router.acquire(MODEL, key()) for _ in range(2)]
    waiting = holds.hold()
    await holds.until_held(1)
    assert holds.wakes == 0  # waiting for room, not for a cold start

    holds.router.update(snapshot())  # the replica is gone: the model starts from zero
    assert holds.wakes == 1
    done, _ = await asyncio.wait({waiting}, timeout=0.5)
    assert not done, "the queue timeout ended a request held for a cold start"

    holds.router.update(snapshot(route("m-2")))
    assert (await waiting).route.replica_id == "m-2"
    assert holds.router.cold_start_holds() == {(MODEL, "served"): 1}
    for lease in full:
        lease.release()


async def test_closing_turns_held_requests_away() -> None:
    holds = Holds()
    held = holds.hold()
    await holds.until_held(1)
    await holds.router.close()
    with pytest.raises(Saturated):
        await held
    assert holds.router.cold_start_holds() == {(MODEL, "failed"): 1}


async def test_a_request_held_again_when_its_model_goes_back_to_zero_waits_from_that_moment() -> (
    None
):
    """Held from zero, then a replica without room for it came and went: the request is held
    for a whole cold-start timeout from when the model lost the replica, and the leader
    hears of the demand at once, as for a request that was only waiting for room."""
    clock = FakeClock()
    holds = Holds(clock=clock)
    holds.router.update(snapshot(cold_start_s={MODEL: 0.6}))
    held = [holds.hold() for _ in range(3)]
    await holds.until_held(3)
    assert holds.wakes == 1
    holds.router.update(snapshot(route("m-1", target_waiting=1), cold_start_s={MODEL: 0.6}))
    await holds.until_held(1)  # two served, one waits for room
    await asyncio.sleep(0.4)  # most of the first hold's timeout is gone

    holds.router.update(snapshot(cold_start_s={MODEL: 0.6}))  # back to zero
    assert holds.wakes == 2
    done, _ = await asyncio.wait({held[2]}, timeout=0.4)
    assert not done, "the request was timed out on its first hold's clock"
    holds.router.update(snapshot(route("m-2"), cold_start_s={MODEL: 0.6}))
    assert (await held[2]).route.replica_id == "m-2"
    for task in held:
        task.result().release()
    assert holds.router.cold_start_holds() == {(MODEL, "served"): 3}


async def test_a_table_that_changes_while_at_zero_does_not_restart_the_hold() -> None:
    holds = Holds()
    holds.router.update(snapshot(cold_start_s={MODEL: 0.3}))
    held = holds.hold()
    await holds.until_held(1)
    await asyncio.sleep(0.2)
    holds.router.update(snapshot(route("x-1", model=OTHER), cold_start_s={MODEL: 0.3}))

    with pytest.raises(ColdStartTimedOut):
        await asyncio.wait_for(held, timeout=0.25)
    assert holds.wakes == 1


async def test_a_cold_start_timeout_brought_down_ends_the_holds_past_it_with_the_new_one() -> None:
    """An operator lowers the timeout of a model that cannot start (no GPU it fits on):
    requests held longer than the new timeout are answered at once, naming it, and the
    others by it, not by the timeout they were held under."""
    holds = Holds()
    holds.router.update(snapshot(cold_start_s={MODEL: 3600.0}))
    held = holds.hold()
    await holds.until_held(1)

    holds.router.update(snapshot(cold_start_s={MODEL: 0.05}))

    with pytest.raises(ColdStartTimedOut) as ended:
        await asyncio.wait_for(held, timeout=5)
    assert ended.value.timeout_s == 0.05
    holds.router.update(snapshot(cold_start_s={MODEL: 3600.0}))
    later = holds.hold()
    await holds.until_held(1)
    holds.router.update(snapshot(cold_start_s={MODEL: 0.5}))
    holds.router.update(snapshot(cold_start_s={MODEL: 3600.0}))  # raised again: no longer
    with pytest.raises(ColdStartTimedOut) as ended:
        await asyncio.wait_for(later, timeout=5)
    assert ended.value.timeout_s == 0.5
    assert holds.router.cold_start_holds() == {(MODEL, "timed_out"): 2}


async def test_a_stopping_gateway_turns_held_requests_away_and_keeps_those_waiting_for_room() -> (
    None
):
    """Held requests are answered at once (another gateway can hold them); one waiting for a
    replica's room is not: the replica frees one within the queue timeout."""
    holds = Holds()
    held = holds.hold()
    await holds.until_held(1)
    holds.router.update(snapshot(route("x-1", model=OTHER, target_waiting=1)))
    full = [await holds.router.acquire(OTHER, key()) for _ in range(2)]
    waiting = asyncio.create_task(holds.router.acquire(OTHER, key()))
    _started.append(waiting)
    await wait_until(lambda: holds.router.queued() == {MODEL: 1, OTHER: 1}, what="both queued")

    assert holds.router.turn_away_held() == 1

    with pytest.raises(GatewayStopping):
        await held
    assert holds.router.queued() == {OTHER: 1}
    with pytest.raises(GatewayStopping):
        await holds.router.acquire(MODEL, key())
    full[0].release()
    assert (await waiting).route.replica_id == "x-1"
    assert holds.router.cold_start_holds() == {(MODEL, "failed"): 1}


def failing(clock: FakeClock, retry_in_s: float) -> StartFailure:
    return StartFailure(failures=2, retry_at=clock.now + retry_in_s)


async def test_a_model_failing_to_start_is_refused_at_once_until_its_backoff_ends() -> None:
    """Not held for its whole cold-start timeout to end in "starting from zero": no replica
    is placed before the backoff ends."""
    clock = FakeClock()
    holds = Holds(clock=clock)
    holds.router.update(snapshot(start_failures={MODEL: failing(clock, 17.5)}))

    with pytest.raises(FailingToStart) as raised:
        await asyncio.wait_for(holds.router.acquire(MODEL, key()), timeout=1.0)

    refusal = raised.value
    assert (refusal.model, refusal.failures) == (MODEL, 2)
    assert refusal.retry_after_s == 18.0
    assert holds.router.queued() == {}
    assert holds.wakes == 0
    assert holds.router.cold_start_holds() == {}

    clock.now += 17.5  # the backoff is over: the next replica is under way
    held = holds.hold()
    await holds.until_held(1)
    holds.router.update(snapshot(route("m-1")))
    assert (await held).route.replica_id == "m-1"


async def test_requests_held_when_the_model_is_seen_failing_to_start_are_answered_at_once() -> None:
    clock = FakeClock()
    holds = Holds(clock=clock)
    held = [holds.hold(), holds.hold()]
    await holds.until_held(2)

    holds.router.update(snapshot(start_failures={MODEL: failing(clock, 0.4)}))

    results = await asyncio.gather(*held, return_exceptions=True)
    assert [type(r) for r in results] == [FailingToStart, FailingToStart]
    assert [r.retry_after_s for r in results] == [1.0, 1.0]  # type: ignore[union-attr]
    assert holds.router.queued() == {}
    assert holds.router.cold_start_holds() == {(MODEL, "failed"): 2}


async def test_a_failure_of_a_model_that_still_has_a_route_changes_nothing() -> None:
    clock = FakeClock()
    holds = Holds(clock=clock)
    holds.router.update(snapshot(route("m-1"), start_failures={MODEL: failing(clock, 30.0)}))

    lease = await asyncio.wait_for(holds.router.acquire(MODEL, key()), timeout=1.0)
    assert lease.route.replica_id == "m-1"


async def test_a_model_without_a_policy_failing_to_start_is_told_so_not_no_replica() -> None:
    clock = FakeClock()
    holds = Holds(clock=clock)
    holds.router.update(snapshot(start_failures={OTHER: failing(clock, 5.0)}))

    with pytest.raises(FailingToStart) as raised:
        await asyncio.wait_for(holds.router.acquire(OTHER, key()), timeout=1.0)
    assert raised.value.retry_after_s == 5.0


async def test_a_model_its_operator_scaled_to_zero_is_refused_as_scaled_to_zero() -> None:
    """Even in failure backoff: no attempt comes when the backoff ends."""
    clock = FakeClock()
    holds = Holds(clock=clock)
    failed = {OTHER: failing(clock, 5.0)}
    holds.router.update(snapshot(start_failures=failed, scaled_to_zero=frozenset({OTHER})))

    with pytest.raises(NoServingReplica) as raised:
        await asyncio.wait_for(holds.router.acquire(OTHER, key()), timeout=1.0)
    assert raised.value.scaled_to_zero

    holds.router.update(snapshot())  # scaled up, its replica not serving yet
    with pytest.raises(NoServingReplica) as raised:
        await asyncio.wait_for(holds.router.acquire(OTHER, key()), timeout=1.0)
    assert not raised.value.scaled_to_zero
