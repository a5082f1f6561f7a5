"""A model that may go to zero, whose requests are short and few, through a real leader
and a gateway's real reports: at every pass the gateway has nothing in flight, yet while
its traffic window holds a request to the model's replica the last replica stays; once
the window is empty and ``idle_to_zero_s`` has passed, the model goes to zero.

A gateway that served more replicas within its window than a report lists leaves the least
used out, a lightly used model's: its report names that model among those it left out, so
the last replica stays while the window holds its request, and goes once that request has
left the window while the report is still cut."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import ModelDeclared, model_stream
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from app.domain.traffic import Outcome
from app.gateway.traffic import TrafficWindow
from app.services.control_plane import Leader
from app.store.gateway_reports import MAX_REPORTED_REPLICAS, TrafficReport
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.fake_agents import AgentPki, fake_agent, make_pki
from tests.support.leaders import leading
from tests.support.reporting_gateway import reporting_gateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

WINDOW_S = 2.0
"""The gateway's traffic window: shorter than the idle spell, so the spell is exact."""
POLICY = AutoscalePolicy(
    min_replicas=0,
    max_replicas=1,
    target=1.0,
    up_window_s=0.0,
    down_window_s=0.5,
    idle_to_zero_s=3.0,
)
PASSES_OVER_IDLE_SPELLS = 30
"""At 0.2 s a pass, two idle spells and more: long past when the model would go."""
PASSES_WITHIN_S = 60.0
"""How long those passes may take: 6 s at their interval, but a pass of a machine busy with
other tests took 3.3 s. More time between them only makes the spells longer."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> AgentPki:
    return make_pki(tmp_path_factory.mktemp("idle-heard-pki"))


@pytest_asyncio.fixture(loop_scope="session")
async def leader(
    pg_store: PostgresEventStore, database_url: str, pki: AgentPki
) -> AsyncIterator[Leader]:
    async with leading(pg_store, database_url, pki, "test-leader-idle-heard") as leader:
        yield leader


class FrozenClock:
    """The gateway window's clock, moved only by the test: a request recorded stays in the
    window until the test moves the clock a window on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def declared_and_placed(
    operator: PostgresEventStore, pg_store: PostgresEventStore, model: str
) -> str:
    """Declares ``model`` (one replica, ``POLICY``) as an operator; its replica once placed."""
    spec = ModelSpec(
        name=model,
        command="llmgw-sim-engine --port {port} --model {model}",
        replicas=1,
        autoscale=POLICY,
    )
    await operator.append(
        model_stream(model),
        None,
        [NewEvent(ModelDeclared(model=model, spec=spec))],
        Meta(actor="operator:alice"),
    )
    await wait_until(
        lambda: any(r.model == model for r in pg_store.state.replicas.values()),
        what="the model's replica placed",
    )
    [replica_id] = [r.id for r in pg_store.state.replicas.values() if r.model == model]
    return replica_id


async def test_a_request_in_the_gateways_window_keeps_the_last_replica_until_it_leaves_it(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    engine: AsyncEngine,
    database_url: str,
) -> None:
    model, node_id = f"m-{uuid.uuid4().hex[:6]}", f"gpu-{uuid.uuid4().hex[:8]}"
    reconciler = leader.reconciler
    assert reconciler is not None
    clock = FrozenClock()
    window = TrafficWindow(window_s=WINDOW_S, slots=4, clock=clock)
    gateway = await reporting_gateway(
        database_url,
        f"gw-{node_id}",
        dict,  # nothing in flight at any report: each request is over before one is written
        traffic=lambda: TrafficReport(window_s=window.window_s, replicas=window.report()),
        report_interval_s=0.05,
    )
    operator = PostgresEventStore(engine)
    try:
        async with fake_agent(leader.hub.port, pki, node_id, gpus=1):
            replica_id = await declared_and_placed(operator, pg_store, model)
            window.record(replica_id, Outcome.ANSWERED, latency_s=0.05)

            heard_from = reconciler.pass_count
            await wait_until(
                lambda: reconciler.pass_count > heard_from + PASSES_OVER_IDLE_SPELLS,
                within_s=PASSES_WITHIN_S,
                what="passes over two idle spells",
            )
            assert pg_store.state.models[model].spec.replicas == 1
            assert reconciler.last_demand().get(model) == 0

            # A window later the request has left it: the idle spell runs, and the model goes.
            clock.now += WINDOW_S
            await wait_until(
                lambda: pg_store.state.models[model].spec.replicas == 0, what="scaled to zero"
            )
    finally:
        await gateway.close()


def crowd(window: TrafficWindow, model: str) -> None:
    """As many replicas of ``model`` as a report lists, each busier than one request."""
    for number in range(MAX_REPORTED_REPLICAS):
        window.record(f"{model}-{number}", Outcome.ANSWERED, latency_s=0.05)
        window.record(f"{model}-{number}", Outcome.ANSWERED, latency_s=0.05)


@pytest.mark.timeout(90)
async def test_a_model_whose_replica_a_crowded_report_leaves_out_stays_until_its_request_is_gone(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    engine: AsyncEngine,
    database_url: str,
) -> None:
    model, node_id = f"m-{uuid.uuid4().hex[:6]}", f"gpu-{uuid.uuid4().hex[:8]}"
    busy = f"busy-{uuid.uuid4().hex[:6]}"
    reconciler = leader.reconciler
    assert reconciler is not None
    clock = FrozenClock()
    window = TrafficWindow(window_s=WINDOW_S, slots=4, clock=clock)
    gateway_id = f"gw-{node_id}"
    gateway = await reporting_gateway(
        database_url,
        gateway_id,
        dict,  # nothing in flight at any report: each request is over before one is written
        traffic=lambda: TrafficReport(window_s=window.window_s, replicas=window.report()),
        report_interval_s=0.1,
    )
    operator = PostgresEventStore(engine)

    async def names_left_out() -> list[str] | None:
        async with engine.connect() as db:
            named = await db.scalar(
                text(
                    "SELECT traffic->'left_out'->'models' FROM gateway_reports"
                    " WHERE gateway_id = :gateway_id"
                ),
                {"gateway_id": gateway_id},
            )
        return None if named is None else sorted(named)

    try:
        async with fake_agent(leader.hub.port, pki, node_id, gpus=1):
            replica_id = await declared_and_placed(operator, pg_store, model)
            crowd(window, busy)
            window.record(replica_id, Outcome.ANSWERED, latency_s=0.05)
            assert len(window.report()) == MAX_REPORTED_REPLICAS + 1

            heard_from = reconciler.pass_count
            await wait_until(
                lambda: reconciler.pass_count > heard_from + PASSES_OVER_IDLE_SPELLS,
                within_s=PASSES_WITHIN_S,
                what="passes over two idle spells",
            )
            assert pg_store.state.models[model].spec.replicas == 1
            assert reconciler.last_demand().get(model) == 0
            assert await names_left_out() == [model]

            # A window later its request has left it, the crowd's go on: the report is still
            # cut, names no model, and the model goes.
            clock.now += WINDOW_S
            crowd(window, busy)
            window.record(f"{busy}-{MAX_REPORTED_REPLICAS}", Outcome.ANSWERED)
            await wait_until(
                lambda: pg_store.state.models[model].spec.replicas == 0, what="scaled to zero"
            )
            assert await names_left_out() == [busy]
    finally:
        await gateway.close()
