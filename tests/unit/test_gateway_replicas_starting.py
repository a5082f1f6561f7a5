"""A model whose replicas are still starting, as the router refuses a request for it.

Given a model just declared (or scaled up by hand, or with every replica being replaced),
its replicas placed or starting and none serving: a request for it is refused with how
many are starting, so the gateway tells the client to retry in a few seconds and its
operators read no fault. A model the snapshot shows failing to start, scaled to zero by
its operator, or starting from zero under an autoscaling policy (held for its cold start)
is answered as before; so is a model that has routes, all of them tried already.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from app.gateway.lease import Lease
from app.gateway.route_refusals import FailingToStart, NoServingReplica
from app.gateway.router import Router
from app.gateway.table import DEFAULT_TARGET_WAITING, GatewaySnapshot, Route, StartFailure
from tests.support.requests_left import cancel_left
from tests.support.waiting import wait_until

MODEL = "m"
HOLD_S = 60.0

_started: list[asyncio.Task[Lease]] = []


@pytest.fixture(autouse=True)
async def _no_request_left_waiting() -> AsyncIterator[None]:
    yield
    await cancel_left(_started)


def route(replica_id: str, *, target_waiting: int = DEFAULT_TARGET_WAITING) -> Route:
    return Route(
        replica_id=replica_id,
        model=MODEL,
        url=f"http://{replica_id}",
        target_waiting=target_waiting,
    )


def snapshot(
    *routes: Route,
    starting: int = 0,
    cold_start_s: float | None = None,
    start_failures: dict[str, StartFailure] | None = None,
    scaled_to_zero: bool = False,
) -> GatewaySnapshot:
    return GatewaySnapshot(
        declared=frozenset({MODEL}),
        routes={MODEL: routes} if routes else {},
        starting={MODEL: starting} if starting else {},
        cold_start_s={MODEL: cold_start_s} if cold_start_s is not None else {},
        start_failures=start_failures or {},
        scaled_to_zero=frozenset({MODEL}) if scaled_to_zero else frozenset(),
    )


def router_with(table: GatewaySnapshot) -> Router:
    router = Router(queue_timeout_s=HOLD_S)
    router.update(table)
    return router


def key() -> str:
    return f"key-{uuid.uuid4().hex[:8]}"


async def refusal(router: Router, exclude: frozenset[str] = frozenset()) -> Exception:
    with pytest.raises((NoServingReplica, FailingToStart)) as raised:
        await asyncio.wait_for(router.acquire(MODEL, key(), exclude), timeout=1.0)
    return raised.value


async def test_a_model_whose_replicas_are_starting_is_refused_saying_how_many() -> None:
    refused = await refusal(router_with(snapshot(starting=2)))

    assert isinstance(refused, NoServingReplica)
    assert (refused.model, refused.starting, refused.scaled_to_zero) == (MODEL, 2, False)


async def test_a_model_with_no_replica_at_all_is_refused_as_before() -> None:
    refused = await refusal(router_with(snapshot()))

    assert isinstance(refused, NoServingReplica)
    assert (refused.starting, refused.scaled_to_zero) == (0, False)


async def test_a_model_scaled_to_zero_is_refused_as_scaled_to_zero_whatever_still_starts() -> None:
    """A replica placed just before its operator scaled the model to zero is being stopped:
    nothing serves the model until an operator scales it up again."""
    refused = await refusal(router_with(snapshot(starting=1, scaled_to_zero=True)))

    assert isinstance(refused, NoServingReplica)
    assert (refused.starting, refused.scaled_to_zero) == (0, True)


async def test_a_model_failing_to_start_is_refused_as_failing_to_start() -> None:
    """The snapshot reads no model as both (a backoff is read only with none starting); if
    one were, its failures are what an operator must see."""
    failure = StartFailure(failures=3, retry_at=10**9)
    refused = await refusal(router_with(snapshot(starting=1, start_failures={MODEL: failure})))

    assert isinstance(refused, FailingToStart)


async def test_a_model_starting_from_zero_under_an_autoscaling_policy_is_held_not_refused() -> None:
    router = router_with(snapshot(starting=1, cold_start_s=HOLD_S))
    held = asyncio.create_task(router.acquire(MODEL, key()))
    _started.append(held)

    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request held")
    router.update(snapshot(route("a"), cold_start_s=HOLD_S))
    lease = await asyncio.wait_for(held, timeout=1.0)
    assert lease.route.replica_id == "a"


async def test_a_model_whose_routes_were_all_tried_is_refused_as_before() -> None:
    """Its one replica serves (another is starting) but failed this request already."""
    refused = await refusal(router_with(snapshot(route("a"), starting=1)), frozenset({"a"}))

    assert isinstance(refused, NoServingReplica)
    assert refused.starting == 0


async def test_waiters_of_a_model_whose_last_route_left_while_others_start_are_told_so() -> None:
    """Every replica is being replaced (a rollout, a drain): the requests waiting for room
    on the last one are refused with the replacements' count when it leaves, as a new
    request is."""
    router = router_with(snapshot(route("a", target_waiting=1)))  # two in flight at most
    held = [await router.acquire(MODEL, key()) for _ in range(2)]
    waiting = asyncio.create_task(router.acquire(MODEL, key()))
    _started.append(waiting)
    await wait_until(lambda: router.queued() == {MODEL: 1}, what="the request queued")

    router.update(snapshot(starting=2))

    with pytest.raises(NoServingReplica) as raised:
        await asyncio.wait_for(waiting, timeout=1.0)
    assert raised.value.starting == 2
    for lease in held:
        lease.release()
