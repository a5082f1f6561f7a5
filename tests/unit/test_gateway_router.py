"""The router's bookkeeping and waiting line, without engines: no scrapers run here, so
every replica is judged by the gateway's own in-flight count (the staleness rule)."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from app.gateway.lease import Lease
from app.gateway.route_refusals import NoServingReplica, Saturated
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, Route, RoutePolicy
from tests.support.waiting import wait_until

MODEL = "m"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def snapshot(*routes: Route) -> GatewaySnapshot:
    by_model: dict[str, tuple[Route, ...]] = {}
    for route in routes:
        by_model[route.model] = (*by_model.get(route.model, ()), route)
    return GatewaySnapshot(declared=frozenset(by_model), routes=by_model)


def route(replica_id: str, *, model: str = MODEL, **settings: object) -> Route:
    return Route(replica_id=replica_id, model=model, url=f"http://{replica_id}", **settings)  # type: ignore[arg-type]


def router_with(*routes: Route, **options: object) -> Router:
    router = Router(**options)  # type: ignore[arg-type]
    router.update(snapshot(*routes))
    return router


def key() -> str:
    return f"key-{uuid.uuid4().hex[:8]}"


async def test_unknown_model_or_every_replica_excluded_is_no_serving_replica() -> None:
    router = router_with(route("a"))
    with pytest.raises(NoServingReplica) as raised:
        await router.acquire("other", key())
    assert raised.value.model == "other"
    with pytest.raises(NoServingReplica):
        await router.acquire(MODEL, key(), frozenset({"a"}))


async def test_requests_are_spread_by_in_flight_per_weight() -> None:
    router = router_with(route("a", weight=2.0), route("b"))
    leases = [await router.acquire(MODEL, key()) for _ in range(6)]
    assert router.in_flight() == {"a": 4, "b": 2}
    assert [lease.queued_s for lease in leases] == [0.0] * 6


async def test_excluded_replicas_are_skipped() -> None:
    router = router_with(route("a"), route("b"))
    for _ in range(3):
        lease = await router.acquire(MODEL, key(), frozenset({"a"}))
        assert lease.route.replica_id == "b"


async def test_a_lease_counts_until_released_and_releasing_twice_is_harmless() -> None:
    router = router_with(route("a"))
    lease = await router.acquire(MODEL, key())
    assert router.replica_views()[0].reserved == 1
    lease.first_byte()
    lease.first_byte()
    assert router.replica_views()[0].reserved == 0
    assert router.in_flight() == {"a": 1}
    lease.release()
    lease.release()
    lease.first_byte()
    assert router.in_flight() == {"a": 0}


async def test_release_drops_a_reservation_without_a_first_byte() -> None:
    router = router_with(route("a"))
    (await router.acquire(MODEL, key())).release()
    view = router.replica_views()[0]
    assert (view.in_flight, view.reserved, view.stale) == (0, 0, True)
    assert router.stale_replicas() == 1


async def fill(router: Router, count: int) -> list[Lease]:
    return [await router.acquire(MODEL, key()) for _ in range(count)]


async def test_when_all_are_full_a_request_waits_and_gets_the_next_free_slot() -> None:
    clock = FakeClock()
    router = router_with(route("a", target_waiting=1), clock=clock)  # two in flight at most
    held = await fill(router, 2)
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    clock.now += 0.5
    held[0].release()
    lease = await waiting
    assert lease.route.replica_id == "a"
    assert lease.queued_s == pytest.approx(0.5)
    assert router.queued() == {}
    assert router.in_flight() == {"a": 2}


async def test_a_first_byte_alone_does_not_free_a_stale_replica() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=0.2)
    held = await fill(router, 2)
    for lease in held:
        lease.first_byte()
    with pytest.raises(Saturated):
        await router.acquire(MODEL, key())


async def test_the_queue_timeout_ends_in_saturated_with_a_retry_after() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=0.1)
    await fill(router, 2)
    with pytest.raises(Saturated) as raised:
        await router.acquire(MODEL, key())
    assert raised.value.retry_after_s >= 1.0
    assert router.queued() == {}


async def test_a_full_queue_refuses_at_once() -> None:
    router = router_with(route("a", target_waiting=1), queue_limit=1, queue_timeout_s=30)
    await fill(router, 2)
    first = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    with pytest.raises(Saturated):
        await asyncio.wait_for(router.acquire(MODEL, key()), timeout=1.0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert router.queued() == {}


async def test_a_full_queue_is_shared_evenly_the_flooding_key_giving_up_its_newest() -> None:
    """One key fills the queue: another key's request still gets in, in the place of the
    flooding key's newest one (answered 429 as a full queue answers), until both have
    half; past that, a full queue refuses as before."""
    router = router_with(route("a", target_waiting=1), queue_limit=4, queue_timeout_s=30)
    full = await fill(router, 2)
    flood = []
    for _ in range(4):
        flood.append(asyncio.create_task(router.acquire(MODEL, "flooding")))
        await until_queued(router, len(flood))
    with pytest.raises(Saturated):
        await asyncio.wait_for(router.acquire(MODEL, "flooding"), timeout=1.0)

    modest = [asyncio.create_task(router.acquire(MODEL, "modest")) for _ in range(2)]

    with pytest.raises(Saturated):
        await flood[3]  # the newest first
    with pytest.raises(Saturated):
        await flood[2]
    await until_queued(router, 4)
    with pytest.raises(Saturated):  # two each: the full queue is shared evenly
        await asyncio.wait_for(router.acquire(MODEL, "modest"), timeout=1.0)
    assert all(not task.done() for task in (*flood[:2], *modest))

    for task in (*flood[:2], *modest):
        task.cancel()
    await asyncio.gather(*flood[:2], *modest, return_exceptions=True)
    for lease in full:
        lease.release()
    assert router.queued() == {}


async def until_queued(router: Router, count: int) -> None:
    await wait_until(lambda: sum(router.queued().values()) == count, what=f"{count} queued")


async def until_length(items: list[str], length: int) -> None:
    await wait_until(lambda: len(items) == length, what=f"{length} items")


async def test_waiters_are_served_round_robin_across_keys() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=30)
    held = await fill(router, 2)
    order: list[str] = []

    async def wait_as(name: str) -> None:
        lease = await router.acquire(MODEL, name)
        order.append(name)
        held.append(lease)

    tasks = []
    for name in ("greedy", "greedy", "greedy", "modest"):
        tasks.append(asyncio.create_task(wait_as(name)))
        await until_queued(router, len(tasks))
    for _ in range(4):
        granted = len(order) + 1
        held.pop(0).release()
        await until_length(order, granted)
    await asyncio.gather(*tasks)
    assert order == ["greedy", "modest", "greedy", "greedy"]


async def test_a_lease_granted_to_a_waiter_that_is_cancelled_is_handed_back() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=30)
    held = await fill(router, 2)
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    held[0].release()  # grants the waiter a lease before its task runs again
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert router.in_flight() == {"a": 1}


async def test_kept_replicas_keep_their_counts_across_updates() -> None:
    router = router_with(route("a"), route("b"))
    lease = await router.acquire(MODEL, key())
    router.update(snapshot(route("a", weight=3.0), route("b", weight=3.0), route("c")))
    assert router.in_flight()[lease.route.replica_id] == 1
    assert {v.replica_id: v.weight for v in router.replica_views()} == {
        "a": 3.0,
        "b": 3.0,
        "c": 1.0,
    }


async def test_a_replica_out_of_routing_gets_nothing_but_its_in_flight_is_still_reported() -> None:
    clock = FakeClock()
    router = router_with(route("a"), clock=clock)
    lease = await router.acquire(MODEL, key())
    router.update(snapshot(route("b")))
    assert (await router.acquire(MODEL, key())).route.replica_id == "b"
    assert router.in_flight() == {"a": 1, "b": 1}
    assert [v.replica_id for v in router.replica_views()] == ["b"]
    lease.release()
    assert router.in_flight() == {"a": 0, "b": 1}
    clock.now += 31
    assert router.in_flight() == {"b": 1}


async def test_a_replica_back_in_routing_keeps_its_count() -> None:
    router = router_with(route("a"), route("b"))
    lease = await router.acquire(MODEL, key(), frozenset({"b"}))
    router.update(snapshot(route("b")))
    router.update(snapshot(route("a"), route("b")))
    assert router.in_flight() == {"a": 1, "b": 0}
    lease.release()
    assert router.in_flight() == {"a": 0, "b": 0}


async def test_waiters_of_a_model_that_lost_its_replicas_are_told_so() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=30)
    await fill(router, 2)
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    router.update(snapshot(route("x", model="other")))
    with pytest.raises(NoServingReplica):
        await waiting
    assert router.queued() == {}


async def test_a_new_replica_serves_the_waiters_at_once() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=30)
    await fill(router, 2)
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    router.update(snapshot(route("a", target_waiting=1), route("b")))
    assert (await waiting).route.replica_id == "b"


async def test_draining_replicas_take_work_only_when_the_others_are_full() -> None:
    router = router_with(route("old", draining=True), route("new", target_waiting=1))
    leases = await fill(router, 3)
    assert [lease.route.replica_id for lease in leases] == ["new", "new", "old"]


async def test_close_turns_waiters_away() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=30)
    await fill(router, 2)
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    await router.close()
    with pytest.raises(Saturated):
        await waiting


def test_a_scrape_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Router(scrape_interval_s=0)


def test_retry_after_is_a_few_scrapes_and_at_least_a_second() -> None:
    assert Router().retry_after_s == 1.0
    assert Router(scrape_interval_s=2.0).retry_after_s == 8.0


async def test_a_waiter_cancelled_just_before_a_slot_frees_is_skipped() -> None:
    router = router_with(route("a", target_waiting=1), queue_timeout_s=30)
    held = await fill(router, 2)
    gone = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the first request queued")
    staying = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 2}, what="the second request queued")
    gone.cancel()
    held[0].release()  # before the cancelled task has run again
    assert (await staying).route.replica_id == "a"
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert router.queued() == {}
    assert router.in_flight() == {"a": 2}


async def test_a_retry_waiting_for_the_replicas_it_has_not_tried_holds_up_no_one_behind_it() -> (
    None
):
    router = router_with(
        route("a", target_waiting=1), route("b", target_waiting=1), queue_timeout_s=1.0
    )
    held = [await router.acquire(MODEL, key(), frozenset({"a"})) for _ in range(2)]  # b full
    client = key()
    # The client's request failed on a: its retry waits for b, the only replica left to it.
    retry = asyncio.create_task(router.acquire(MODEL, client, frozenset({"a"})))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the retry queued")

    lease = await router.acquire(MODEL, client)

    assert lease.route.replica_id == "a"
    assert router.queued() == {MODEL: 1}
    held[0].release()
    assert (await retry).route.replica_id == "b"


def bounded(*routes: Route, max_in_flight: int) -> GatewaySnapshot:
    plain = snapshot(*routes)
    return GatewaySnapshot(
        declared=plain.declared,
        routes=plain.routes,
        policies={MODEL: RoutePolicy(max_in_flight=max_in_flight)},
    )


async def test_max_in_flight_holds_requests_in_the_gateway_for_the_first_replica_with_room() -> (
    None
):
    # Without the bound, a third request would wait in replica a's engine (target_waiting
    # leaves it room); with it, the request waits in the gateway and goes where room
    # appears first: a replica that starts serving, or a slot that frees.
    router = Router(queue_timeout_s=30)
    router.update(bounded(route("a"), max_in_flight=2))
    leases = await fill(router, 2)
    third = asyncio.create_task(router.acquire(MODEL, key()))
    fourth = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 2}, what="two requests held")
    assert router.in_flight() == {"a": 2}
    router.update(bounded(route("a"), route("b"), max_in_flight=2))
    assert (await third).route.replica_id == "b"
    assert (await fourth).route.replica_id == "b"
    fifth = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the fifth held")
    leases[0].release()
    lease = await fifth
    assert lease.route.replica_id == "a"
    assert lease.queued_s >= 0
    assert router.in_flight() == {"a": 2, "b": 2}


async def test_the_counts_of_models_removed_go_with_them() -> None:
    """Requests given a replica and cold-start holds are counted by model for /metrics: a
    gateway that runs for months while models come and go keeps the models there are."""
    models = [f"m-{n}" for n in range(1000)]
    router = router_with(*(route(f"{model}-1", model=model) for model in models))
    for model in models:
        (await router.acquire(model, key())).release()
    cold = GatewaySnapshot(declared=frozenset({"cold", "m-7"}), cold_start_s={"cold": 30.0})
    router.update(msgspec.structs.replace(cold, routes={"m-7": (route("m-7-1", model="m-7"),)}))
    held = asyncio.create_task(router.acquire("cold", key()))
    await wait_until(lambda: router.queued() == {"cold": 1}, what="a request held for cold")
    assert {model for model, _, _ in router.route_decisions()} == {"m-7"}
    router.update(snapshot(route("m-7-1", model="m-7")))
    with pytest.raises(NoServingReplica):
        await held
    assert {model for model, _, _ in router.route_decisions()} == {"m-7"}
    assert router.cold_start_holds() == {}
