"""A model in a rollout's canary step: the router sends the canary's share of the requests
to the replicas of its revision and the rest to the others, and when the side a request
drew cannot take it now, the other side does. No scrapers run here, so every replica is
judged by the gateway's own in-flight count (the staleness rule: ``2 * target_waiting``
requests at most)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter, deque
from collections.abc import Iterator

import msgspec
import pytest

from app.domain.rendezvous import key_hash
from app.gateway.affinity import RouteKey
from app.gateway.lease import Lease
from app.gateway.router import Router
from app.gateway.table import Canary, GatewaySnapshot, Route, RoutePolicy
from tests.support.waiting import wait_until

MODEL = "llama"
NEW = 2
"""The canary's revision; the model's other replicas run revision 1."""


def route(replica_id: str, revision: int = 1, **settings: object) -> Route:
    return Route(
        replica_id=replica_id,
        model=MODEL,
        url=f"http://{replica_id}",
        revision=revision,
        **settings,  # type: ignore[arg-type]
    )


def table(*routes: Route, share: float | None = None, revision: int = NEW) -> GatewaySnapshot:
    canaries = {} if share is None else {MODEL: Canary(revision=revision, share=share)}
    return GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: routes}, canaries=canaries)


def seeded(seed: int = 7) -> Router:
    return Router(draw=random.Random(seed).random)


def key() -> str:
    return f"key-{uuid.uuid4().hex[:8]}"


async def picks(router: Router, count: int, *, open_at_most: int = 4) -> Counter[str]:
    """Where ``count`` requests go, ``open_at_most`` of them open at a time (the oldest ends
    when one more starts), too few to saturate a replica: which replica of a side takes a
    request then depends on the others open there, as in a gateway. With 0, every request
    ends before the next, and among idle replicas the first in the table takes it."""
    chosen: Counter[str] = Counter()
    open_leases: deque[Lease] = deque()
    for _ in range(count):
        lease = await router.acquire(MODEL, key())
        chosen[lease.route.replica_id] += 1
        open_leases.append(lease)
        while len(open_leases) > open_at_most:
            open_leases.popleft().release()
    for lease in open_leases:
        lease.release()
    return chosen


STABLE = (route("llama-1"), route("llama-2"))
CANARY = route("llama-3", NEW)


async def test_a_tenth_of_20000_requests_go_to_the_canary_and_the_rest_spread_over_the_others() -> (
    None
):
    router = seeded()
    router.update(table(*STABLE, CANARY, share=0.1))

    chosen = await picks(router, 20_000)

    # Binomial: the standard deviation is 0.21 % of the requests; this band is 3.3 of them.
    assert 1_860 <= chosen["llama-3"] <= 2_140, chosen
    # Within the stable side the usual rule spreads requests (by in-flight per weight).
    assert chosen["llama-1"] > 7_000
    assert chosen["llama-2"] > 7_000
    assert chosen.total() == 20_000


async def test_the_share_is_the_canarys_whatever_the_weights_say() -> None:
    """Without a canary the heavier stable replicas would take nearly every request."""
    router = seeded()
    heavy = (route("llama-1", weight=50.0), route("llama-2", weight=50.0))
    router.update(table(*heavy, route("llama-3", NEW), share=0.25))

    chosen = await picks(router, 4_000)

    assert 900 <= chosen["llama-3"] <= 1_100, chosen


async def test_with_share_1_every_request_goes_to_the_canary_revision() -> None:
    router = seeded()
    router.update(table(*STABLE, CANARY, route("llama-4", NEW), share=1.0))

    chosen = await picks(router, 1_000)

    assert set(chosen) == {"llama-3", "llama-4"}
    assert chosen["llama-3"] > 300
    assert chosen["llama-4"] > 300


def scripted(*values: float) -> Iterator[float]:
    yield from values
    raise AssertionError("more draws than requests")


async def test_each_request_draws_once_and_goes_where_its_draw_says() -> None:
    draws = scripted(0.05, 0.5, 0.0999, 0.1, 0.99)
    router = Router(draw=lambda: next(draws))
    router.update(table(route("llama-1"), CANARY, share=0.1))

    chosen = [(await picks(router, 1, open_at_most=0)).most_common(1)[0][0] for _ in range(5)]

    assert chosen == ["llama-3", "llama-1", "llama-3", "llama-1", "llama-1"]


async def test_a_saturated_canary_side_sends_its_requests_to_the_others_at_once() -> None:
    router = seeded()
    router.update(table(route("llama-1"), route("llama-3", NEW, target_waiting=1), share=1.0))
    held = [await router.acquire(MODEL, key()) for _ in range(2)]  # the canary's two
    assert {lease.route.replica_id for lease in held} == {"llama-3"}

    overflow = [await router.acquire(MODEL, key()) for _ in range(3)]

    assert [lease.route.replica_id for lease in overflow] == ["llama-1"] * 3
    assert [lease.queued_s for lease in overflow] == [0.0] * 3
    assert router.queued() == {}
    held[0].release()
    assert (await router.acquire(MODEL, key())).route.replica_id == "llama-3"


async def test_a_saturated_stable_side_sends_its_requests_to_the_canary() -> None:
    router = Router(draw=lambda: 0.5)  # every draw is for the stable side
    router.update(table(route("llama-1", target_waiting=1), CANARY, share=0.1))
    held = [await router.acquire(MODEL, key()) for _ in range(2)]
    assert {lease.route.replica_id for lease in held} == {"llama-1"}

    overflow = await router.acquire(MODEL, key())

    assert overflow.route.replica_id == "llama-3"
    assert overflow.queued_s == 0.0


async def test_when_both_sides_are_saturated_a_request_waits_for_either() -> None:
    router = Router(draw=lambda: 0.0, queue_timeout_s=5.0)  # every draw is for the canary
    router.update(
        table(
            route("llama-1", target_waiting=1), route("llama-3", NEW, target_waiting=1), share=0.5
        )
    )
    held: list[Lease] = [await router.acquire(MODEL, key()) for _ in range(4)]
    assert Counter(lease.route.replica_id for lease in held) == {"llama-1": 2, "llama-3": 2}

    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")
    next(lease for lease in held if lease.route.replica_id == "llama-1").release()

    assert (await waiting).route.replica_id == "llama-1"


async def test_a_retry_that_excludes_the_canary_goes_to_the_others() -> None:
    router = seeded()
    router.update(table(route("llama-1"), CANARY, share=1.0))

    lease = await router.acquire(MODEL, key(), frozenset({"llama-3"}))

    assert lease.route.replica_id == "llama-1"


@pytest.mark.parametrize(
    "routes",
    [(route("llama-1"), route("llama-2")), (route("llama-3", NEW), route("llama-4", NEW))],
    ids=["no-canary-replica-routable-yet", "no-other-replica-left"],
)
async def test_a_model_with_one_side_empty_routes_over_the_side_it_has(
    routes: tuple[Route, ...],
) -> None:
    router = Router(draw=lambda: pytest.fail("no draw without two sides"))
    router.update(table(*routes, share=0.3))

    chosen = await picks(router, 100)

    assert set(chosen) == {r.replica_id for r in routes}
    assert chosen.total() == 100


async def test_without_a_canary_nothing_is_drawn_and_the_weights_decide() -> None:
    router = Router(draw=lambda: pytest.fail("no draw without a canary"))
    router.update(table(route("llama-1", weight=3.0), route("llama-3", NEW)))
    leases = [await router.acquire(MODEL, key()) for _ in range(8)]

    assert router.in_flight() == {"llama-1": 6, "llama-3": 2}
    for lease in leases:
        lease.release()


async def test_a_new_table_takes_the_split_away_or_changes_it() -> None:
    router = seeded()
    router.update(table(route("llama-1"), CANARY, share=1.0))
    assert (await picks(router, 50, open_at_most=0)) == {"llama-3": 50}

    router.update(table(route("llama-1"), CANARY))
    assert (await picks(router, 50, open_at_most=0)) == {"llama-1": 50}

    router.update(table(route("llama-1"), CANARY, share=0.5))
    chosen = await picks(router, 2_000, open_at_most=0)
    assert 900 <= chosen["llama-3"] <= 1_100, chosen


async def test_a_keyed_request_draws_its_side_from_its_key_the_same_in_every_gateway() -> None:
    """Under ``prefix`` and ``session`` a key's turns stay on one side of the split, on one
    replica, in every gateway: a per-request draw would move a conversation between the
    revisions from turn to turn, and two gateways would disagree on where it goes. The
    keys still split by the share, and a key on the canary stays there as the share grows."""
    routes = (*STABLE, CANARY, route("llama-4", NEW))
    session = RoutePolicy(policy="session")

    def keyed(share: float) -> GatewaySnapshot:
        snapshot = table(*routes, share=share)
        return msgspec.structs.replace(snapshot, policies={MODEL: session})

    gateways = [seeded(1), seeded(2)]
    for gateway in gateways:
        gateway.update(keyed(0.3))
    keys = [RouteKey("session", key_hash(f"conversation-{n}".encode())) for n in range(600)]
    where: dict[int, str] = {}
    for route_key in keys:
        for _turn in range(3):
            for gateway in gateways:
                lease = await gateway.acquire(MODEL, "k", route_key=route_key)
                assert where.setdefault(route_key.value, lease.route.replica_id) == (
                    lease.route.replica_id
                )
                lease.release()
    on_canary = {k for k, replica in where.items() if replica in ("llama-3", "llama-4")}
    assert 0.24 < len(on_canary) / len(keys) < 0.36
    for gateway in gateways:
        gateway.update(keyed(0.6))
    for route_key in keys:
        if route_key.value in on_canary:
            lease = await gateways[0].acquire(MODEL, "k", route_key=route_key)
            assert lease.route.revision == NEW
            lease.release()
