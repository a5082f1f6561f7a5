"""The reconciler as a leader runs it: real PostgreSQL, the real agent hub on 127.0.0.1 with
mutual TLS, the fleet view, and in-process agents that speak the real protocol.

An operator writes to the log through a store of its own, as the admin API of another
server would; the leader learns of it from the log alone. Every story is checked in the
log, and in what the agents were sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import timedelta

import asyncpg
import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.admin.metrics import leader_figures
from app.domain.describe import describe
from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ModelScaled,
    ReplicaPlaced,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    StrayStopped,
    event_type,
    model_stream,
    node_stream,
    replica_id_for,
    replica_stream,
)
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from app.domain.state import Replica, ReplicaPhase
from app.services.control_plane import Leader
from app.services.leader import NEXT_EPOCH
from app.store.database import driver_url
from app.store.gateway_reports import delete_report, write_report
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import serving_admin
from tests.support.fake_agents import (
    DEADLINE_S,
    LOOPBACK,
    AgentPki,
    fake_agent,
    gpu,
    make_pki,
    running_shard,
)
from tests.support.leaders import leading
from tests.support.reporting_gateway import reporting_gateway
from tests.support.waiting import wait_until
from wire.messages import (
    PROTOCOL_VERSION,
    Heartbeat,
    Hello,
    ShardStatus,
    StopShard,
    Welcome,
    decode_from_server,
    encode,
)

pytestmark = pytest.mark.timeout(60)

OPERATOR = Meta(actor="operator:alice")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> AgentPki:
    return make_pki(tmp_path_factory.mktemp("reconciler-pki"))


@pytest_asyncio.fixture(loop_scope="session")
async def leader(
    pg_store: PostgresEventStore, database_url: str, pki: AgentPki
) -> AsyncIterator[Leader]:
    async with leading(pg_store, database_url, pki, "test-leader") as leader:
        yield leader


@pytest.fixture
def operator(engine: AsyncEngine) -> PostgresEventStore:
    return PostgresEventStore(engine)


def new_node_id() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


async def declare(
    operator: PostgresEventStore,
    model: str,
    replicas: int,
    autoscale: AutoscalePolicy | None = None,
) -> None:
    spec = ModelSpec(
        name=model,
        command="llmgw-sim-engine --port {port} --model {model}",
        replicas=replicas,
        autoscale=autoscale,
    )
    await operator.append(
        model_stream(model), None, [NewEvent(ModelDeclared(model=model, spec=spec))], OPERATOR
    )


async def record(operator: PostgresEventStore, stream: str, event: AnyEvent) -> None:
    await operator.append(stream, None, [NewEvent(event)], OPERATOR)


def replicas_of(store: PostgresEventStore, model: str) -> list[Replica]:
    return sorted(
        (r for r in store.state.replicas.values() if r.model == model), key=lambda r: r.number
    )


def all_connected(store: PostgresEventStore, nodes: list[str]) -> Callable[[], bool]:
    return lambda: all(n in store.state.nodes and store.state.nodes[n].connected for n in nodes)


async def types_in(store: PostgresEventStore, stream: str) -> list[str]:
    return [event_type(r.event) for r in await store.read_stream(stream)]


async def test_a_model_is_placed_across_nodes_served_and_scaled_down_newest_first(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore, operator: PostgresEventStore
) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    nodes = [new_node_id() for _ in range(3)]
    async with AsyncExitStack() as stack:
        agents = {
            n: await stack.enter_async_context(fake_agent(leader.hub.port, pki, n, gpus=2))
            for n in nodes
        }
        await wait_until(all_connected(pg_store, nodes), what="three nodes connected")

        await declare(operator, model, replicas=2)

        def serving() -> bool:
            replicas = replicas_of(pg_store, model)
            return len(replicas) == 2 and all(r.phase is ReplicaPhase.SERVING for r in replicas)

        await wait_until(serving, what="two replicas serving")
        first, newest = replicas_of(pg_store, model)
        hosts = {r.id: r.shards[0].node_id for r in (first, newest)}
        assert len(set(hosts.values())) == 2, "the two replicas share a node"
        for replica in (first, newest):
            starts = agents[hosts[replica.id]].starts()
            assert [(s.replica_id, s.port, s.argv[0]) for s in starts] == [
                (replica.id, replica.shards[0].port, "llmgw-sim-engine")
            ]
        [idle] = set(nodes) - set(hosts.values())
        assert agents[idle].received == []
        [placed, *_] = await pg_store.read_stream(replica_stream(newest.id))
        assert (placed.meta.actor, placed.meta.epoch) == ("reconciler", leader.epoch)

        await record(
            operator, model_stream(model), ModelScaled(model=model, replicas=1, previous=2)
        )

        async def stopped() -> bool:
            # The store folds an append before its transaction commits: wait for the log
            # itself, not only for the fold.
            recorded = await types_in(pg_store, replica_stream(newest.id))
            return "replica_stopped" in recorded

        await wait_until(stopped, what="the newest replica stopped, in the log")
        assert agents[hosts[newest.id]].stops() == [
            StopShard(
                command_id=f"stop-{newest.id}-0",
                replica_id=newest.id,
                shard_index=0,
                grace_s=30.0,
            )
        ]
        assert agents[hosts[first.id]].stops() == []
        assert pg_store.state.replicas[first.id].phase is ReplicaPhase.SERVING
        assert await types_in(pg_store, replica_stream(newest.id)) == [
            "replica_placed",
            "shard_starting",
            "shard_ready",
            "replica_serving",
            "replica_stopping",
            "shard_stopped",
            "replica_stopped",
        ]


async def test_a_shard_of_a_replica_the_log_never_placed_is_stopped_as_a_stray(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    ghost = running_shard("ghost-7", 20050, pid=4242, model="ghost")

    async with fake_agent(leader.hub.port, pki, node_id, shards=[ghost]) as agent:
        await wait_until(lambda: agent.stops() != [], what="a stop_shard for the stray")
        await wait_until(
            lambda: ("ghost-7", 0) not in agent.shards, what="the agent stopped the stray"
        )

    assert agent.stops() == [
        StopShard(
            command_id="stray-ghost-7-0-4242", replica_id="ghost-7", shard_index=0, grace_s=10.0
        )
    ]
    strays = [
        r
        for r in await pg_store.read_stream(node_stream(node_id))
        if isinstance(r.event, StrayStopped)
    ]
    assert [(r.meta.actor, r.event) for r in strays] == [
        (
            "reconciler",
            StrayStopped(
                node_id=node_id,
                replica_id="ghost-7",
                shard_index=0,
                model="ghost",
                port=20050,
                pid=4242,
                rule="the log knows no such replica",
            ),
        )
    ]


async def test_a_pass_names_itself_on_its_lines_and_the_answer_names_the_node(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    ghost = running_shard("ghost-8", 20055, pid=4343, model="ghost")

    with capture_logs(processors=[merge_contextvars]) as logs:
        async with fake_agent(leader.hub.port, pki, node_id, shards=[ghost]) as agent:
            await wait_until(lambda: agent.stops() != [], what="a stop_shard for the stray")
            await wait_until(
                lambda: any(e["event"] == "agent_command_completed" for e in logs),
                what="the agent's answer",
            )

    [decided] = [
        e
        for e in logs
        if e["event"] == "reconcile_pass" and "stray_stopped" in e.get("event_types", {})
    ]
    reconciler = leader.reconciler
    assert reconciler is not None
    assert 1 <= decided["reconcile_pass"] <= reconciler.pass_count
    [answered] = [e for e in logs if e["event"] == "agent_command_completed"]
    assert answered["node_id"] == node_id  # bound by the hub's handler of that connection
    assert answered["command_id"] == "stray-ghost-8-0-4343"
    assert answered["remote_address"].startswith(f"{LOOPBACK}:")


async def test_a_command_goes_once_per_connection_and_again_after_a_reconnect(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    stubborn = running_shard("ghost-9", 20060, pid=777)
    reconciler = leader.reconciler
    assert reconciler is not None

    async with fake_agent(leader.hub.port, pki, node_id, shards=[stubborn], obeys=False) as agent:
        await wait_until(lambda: agent.stops() != [], what="a stop_shard for the stray")
        # The stray keeps running, so every pass decides to stop it again.
        passes = reconciler.pass_count
        await wait_until(lambda: reconciler.pass_count >= passes + 5, what="five more passes")
        assert [s.command_id for s in agent.stops()] == ["stray-ghost-9-0-777"]

    async with fake_agent(
        leader.hub.port, pki, node_id, shards=[stubborn], obeys=False
    ) as reconnected:
        await wait_until(lambda: reconnected.stops() != [], what="the stop sent again")
        assert [s.command_id for s in reconnected.stops()] == ["stray-ghost-9-0-777"]

    assert (await types_in(pg_store, node_stream(node_id))).count("stray_stopped") == 1


async def place_as_before(operator: PostgresEventStore, node_id: str, gpus: int = 1) -> str:
    """A model of one replica placed on ``node_id`` (port 20001), as a previous leader left
    it in the log; the replica's id."""
    model = f"m-{uuid.uuid4().hex[:6]}"
    replica_id = replica_id_for(model, 1)
    spec = ModelSpec(name=model, command="llmgw-sim-engine --port {port}", replicas=1)
    placement = ShardPlacement(index=0, node_id=node_id, gpus=tuple(range(gpus)), port=20001)
    placed = ReplicaPlaced(replica_id=replica_id, model=model, number=1, shards=(placement,))
    await operator.append_many(
        [
            AppendRequest(
                model_stream(model), None, [NewEvent(ModelDeclared(model=model, spec=spec))]
            ),
            AppendRequest(replica_stream(replica_id), None, [NewEvent(placed)]),
        ],
        OPERATOR,
    )
    return replica_id


async def test_a_start_its_node_refuses_fails_the_replica_at_once_with_the_nodes_reason(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore, operator: PostgresEventStore
) -> None:
    """Before, the refusal was only logged: the replica stayed placed until its startup
    timeout (ten minutes) and ended "timed out", the node's reason nowhere in the log."""
    node_id = new_node_id()
    model = f"m-{uuid.uuid4().hex[:6]}"
    taken = "port 20000 is already used by replica m-0 shard 0 (pid 4242)"

    async with fake_agent(leader.hub.port, pki, node_id, refuses_starts=taken) as agent:
        await wait_until(all_connected(pg_store, [node_id]), what="the node connected")
        await declare(operator, model, replicas=1)
        await wait_until(lambda: agent.starts() != [], what="a start_shard")
        [start] = agent.starts()

        async def failed() -> bool:
            return "replica_failed" in await types_in(pg_store, replica_stream(start.replica_id))

        await wait_until(failed, what="the replica failed, in the log")

    history = await pg_store.read_stream(replica_stream(start.replica_id))
    [shard_failed] = [r for r in history if isinstance(r.event, ShardFailed)]
    assert (shard_failed.meta.actor, shard_failed.meta.causation_id) == (
        f"agent:{node_id}",
        start.command_id,
    )
    assert isinstance(shard_failed.event, ShardFailed)
    assert shard_failed.event.error == f"start refused: {taken}"
    assert pg_store.state.models[model].failures >= 1


async def test_an_engine_left_outside_its_nodes_new_port_range_is_stopped_and_replaced_not_failed(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore, operator: PostgresEventStore
) -> None:
    """The node's agent restarts with another ``--port-range`` while its engine runs on at a
    port of the old one. Before, the engine was stopped as a stray and its replica failed
    "stopped without being asked to", so the model backed off before the replacement and
    the replica's history never said why."""
    node_id, model = new_node_id(), f"m-{uuid.uuid4().hex[:6]}"
    new_range = (20100, 20199)
    async with fake_agent(leader.hub.port, pki, node_id):
        await declare(operator, model, replicas=1)
        replica = await the_one_serving(pg_store, model)
    [shard] = replica.shards
    engine = running_shard(replica.id, shard.port, pid=4100, model=model)

    async with fake_agent(
        leader.hub.port, pki, node_id, shards=[engine], port_range=new_range
    ) as restarted:

        async def ended() -> bool:
            recorded = await types_in(pg_store, replica_stream(replica.id))
            return "replica_stopped" in recorded or "replica_failed" in recorded

        await wait_until(ended, within_s=20.0, what="the replica ended, in the log")
        reason = f"port {shard.port} is outside {node_id}'s port range 20100-20199"
        history = await pg_store.read_stream(replica_stream(replica.id))
        assert [event_type(r.event) for r in history][-3:] == [
            "replica_stopping",
            "shard_stopped",
            "replica_stopped",
        ]
        assert describe(history[-3].event) == (
            f"replica {replica.id} out of routing, stopping: {reason}"
        )
        await wait_until(
            lambda: any(r.phase is ReplicaPhase.SERVING for r in replicas_of(pg_store, model)),
            within_s=20.0,
            what="a replacement serving",
        )

    assert pg_store.state.replicas[replica.id].end_reason == reason
    assert [s.command_id for s in restarted.stops()] == [f"stop-{replica.id}-0"]
    assert "stray_stopped" not in await types_in(pg_store, node_stream(node_id))
    [replacement] = [r for r in replicas_of(pg_store, model) if r.id != replica.id]
    assert [s.port for s in restarted.starts()] == [replacement.shards[0].port]
    assert new_range[0] <= replacement.shards[0].port <= new_range[1]
    assert pg_store.state.models[model].failures == 0


async def test_a_pid_no_shards_row_can_hold_costs_only_the_node_that_reported_it(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore, operator: PostgresEventStore
) -> None:
    """A node reports the replica a previous leader placed on it ready, with pid 2**40.
    Before, the leader adopted it with that pid, the append failed (the shards table's pid
    is 32-bit), and so did every pass after it: no node was sent a command again. Now the
    status is malformed at the wire: the liar's connection is closed, the others carry on."""
    liar_id, honest_id = new_node_id(), new_node_id()
    hello = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=liar_id,
        agent_version="liar",
        address=LOOPBACK,
        port_range=(20000, 20099),
        gpus=(gpu(0),),
    )
    async with (
        fake_agent(leader.hub.port, pki, honest_id) as honest,
        connect(
            f"wss://{LOOPBACK}:{leader.hub.port}", ssl=pki.node(liar_id), open_timeout=DEADLINE_S
        ) as liar,
    ):
        await liar.send(encode(hello), text=True)
        assert isinstance(decode_from_server(await liar.recv()), Welcome)
        alive = asyncio.create_task(keep_alive(liar))
        await wait_until(all_connected(pg_store, [liar_id, honest_id]), what="both connected")
        lied_about = await place_as_before(operator, liar_id)
        lie = ShardStatus(
            replica_id=lied_about, shard_index=0, state="ready", pid=2**40, port=20001
        )
        await liar.send(encode(lie), text=True)

        def heard_out() -> bool:  # the status in the fleet view, or its connection closed
            report = leader.tracker.snapshot().reports.get(liar_id)
            return liar.close_code is not None or (
                report is not None and (lied_about, 0) in report.shards
            )

        await wait_until(heard_out, what="the liar's status taken in or refused")
        honest_replica = await place_as_before(operator, honest_id)
        await wait_until(lambda: honest.starts() != [], what="the honest node's start")
        assert [s.replica_id for s in honest.starts()] == [honest_replica]
        async with asyncio.timeout(DEADLINE_S):
            await liar.wait_closed()
        assert liar.close_code == 1002
        assert "$.pid" in (liar.close_reason or "")
        await alive
    assert "replica_adopted" not in await types_in(pg_store, replica_stream(lied_about))


async def keep_alive(agent: ClientConnection) -> None:
    """Heartbeats until the connection closes, reading (and dropping) what the hub sends."""
    with contextlib.suppress(ConnectionClosed):
        for seq in itertools.count():
            await agent.send(encode(Heartbeat(seq=seq)), text=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    while True:
                        await agent.recv()


async def test_a_leader_whose_epoch_was_taken_stops_leading_and_places_nothing(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    operator: PostgresEventStore,
    database_url: str,
) -> None:
    node_id = new_node_id()
    async with fake_agent(leader.hub.port, pki, node_id, gpus=2) as agent:
        await wait_until(all_connected(pg_store, [node_id]), what="the node connected")
        usurper = await asyncpg.connect(driver_url(database_url))
        try:
            taken = await usurper.fetchval(NEXT_EPOCH, "another-server")
        finally:
            await usurper.close()
        assert taken == leader.epoch + 1

        await declare(operator, f"m-{uuid.uuid4().hex[:6]}", replicas=1)

        reason = await asyncio.wait_for(leader.deposed(), 10)
        assert f"superseded by epoch {taken}" in reason
        assert agent.starts() == []
    recorded = await pg_store.read_all(limit=10_000)
    assert "replica_placed" not in [event_type(r.event) for r in recorded]
    assert all(r.meta.epoch in (None, leader.epoch) for r in recorded)


async def test_a_replica_out_of_routing_is_stopped_once_no_gateway_reports_requests_on_it(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    operator: PostgresEventStore,
    database_url: str,
) -> None:
    model, node_id = f"m-{uuid.uuid4().hex[:6]}", new_node_id()
    reconciler = leader.reconciler
    assert reconciler is not None
    open_requests: dict[str, int] = {}
    gateway = await reporting_gateway(database_url, f"gw-{node_id}", lambda: dict(open_requests))
    try:
        async with fake_agent(leader.hub.port, pki, node_id, gpus=1) as agent:
            await declare(operator, model, replicas=1)
            replica = await the_one_serving(pg_store, model)
            open_requests[replica.id] = 2  # a long request the gateway is still relaying

            await record(
                operator, model_stream(model), ModelScaled(model=model, replicas=0, previous=1)
            )
            await wait_until(
                lambda: pg_store.state.replicas[replica.id].stopping_since is not None,
                what="the replica out of routing",
            )
            stopping_since = pg_store.state.replicas[replica.id].stopping_since
            assert stopping_since is not None
            quiesced = stopping_since + timedelta(seconds=reconciler.settings.quiesce_s + 1)
            await wait_until(
                lambda: reconciler.passes[-1].at > quiesced,
                what="passes after the quiesce time",
            )
            assert agent.stops() == []

            open_requests.clear()
            await wait_until(lambda: agent.stops() != [], what="the replica stopped once idle")
            assert [s.replica_id for s in agent.stops()] == [replica.id]
    finally:
        await gateway.close()


async def test_the_demand_a_pass_sampled_reaches_metrics_through_the_leaders_figures(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    operator: PostgresEventStore,
    database_url: str,
) -> None:
    model, node_id = f"m-{uuid.uuid4().hex[:6]}", new_node_id()
    open_requests: dict[str, int] = {}
    gateway = await reporting_gateway(database_url, f"gw-{node_id}", lambda: dict(open_requests))
    try:
        async with (
            fake_agent(leader.hub.port, pki, node_id, gpus=1),
            serving_admin(pg_store, live=lambda: leader_figures(leader)) as url,
            httpx.AsyncClient(base_url=url) as scraper,
        ):
            policy = AutoscalePolicy(min_replicas=1, max_replicas=1)
            await declare(operator, model, replicas=1, autoscale=policy)
            replica = await the_one_serving(pg_store, model)
            open_requests[replica.id] = 3

            async def demand_scraped() -> float | None:
                page = (await scraper.get("/metrics")).text
                return next(
                    (
                        sample.value
                        for family in text_string_to_metric_families(page)
                        for sample in family.samples
                        if sample.name == "llmgw_model_demand" and sample.labels == {"model": model}
                    ),
                    None,
                )

            await wait_until(
                lambda: leader_figures(leader).demand.get(model) == 3,
                what="a pass sampling the gateway's 3 requests in flight",
            )
            assert await demand_scraped() == 3
            open_requests.clear()
            await wait_until(
                lambda: leader_figures(leader).demand.get(model) == 0, what="the demand gone"
            )
            assert await demand_scraped() == 0
    finally:
        await gateway.close()


async def test_an_autoscaled_model_keeps_its_count_while_no_gateway_reports(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    operator: PostgresEventStore,
    database_url: str,
) -> None:
    model, node_id = f"m-{uuid.uuid4().hex[:6]}", new_node_id()
    reconciler = leader.reconciler
    assert reconciler is not None
    open_requests: dict[str, int] = {}
    gateway = await reporting_gateway(
        database_url, f"gw-{node_id}", lambda: dict(open_requests), report_interval_s=0.05
    )
    policy = AutoscalePolicy(
        min_replicas=1, max_replicas=2, target=1.0, up_window_s=0.0, down_window_s=0.5
    )
    try:
        async with fake_agent(leader.hub.port, pki, node_id, gpus=2):
            await declare(operator, model, replicas=1, autoscale=policy)
            replica = await the_one_serving(pg_store, model)
            open_requests[replica.id] = 2
            await wait_until(
                lambda: pg_store.state.models[model].spec.replicas == 2, what="scaled up to 2"
            )

            # The only gateway goes away (its report is deleted as it closes), busy as it
            # was: what it last said is all there is, and silence is not "no requests".
            with capture_logs() as logs:
                await gateway.close()
                silent_from = reconciler.pass_count
                await wait_until(
                    lambda: reconciler.pass_count > silent_from + 20,
                    what="passes over several down windows",
                )
            assert pg_store.state.models[model].spec.replicas == 2
            assert "autoscale_demand_unknown" in [line["event"] for line in logs]
            assert model not in leader_figures(leader).demand  # unknown, not the last heard
    finally:
        await gateway.close()


async def test_an_autoscaled_model_does_not_scale_down_while_a_gateway_is_silent(
    leader: Leader,
    pki: AgentPki,
    pg_store: PostgresEventStore,
    operator: PostgresEventStore,
    database_url: str,
) -> None:
    model, node_id = f"m-{uuid.uuid4().hex[:6]}", new_node_id()
    reconciler = leader.reconciler
    assert reconciler is not None
    stalled = f"gw-stalled-{node_id}"
    gateway = await reporting_gateway(
        database_url, f"gw-{node_id}", dict, report_interval_s=0.05
    )  # a gateway with nothing open for the model, reporting all along
    db = await asyncpg.connect(driver_url(database_url))
    policy = AutoscalePolicy(
        min_replicas=1, max_replicas=2, target=1.0, up_window_s=0.0, down_window_s=0.5
    )
    try:
        async with fake_agent(leader.hub.port, pki, node_id, gpus=2):
            await declare(operator, model, replicas=1, autoscale=policy)
            replica = await the_one_serving(pg_store, model)
            # Another gateway carries two requests on it, then stalls: its last report
            # stays, older and older, and says nothing of what it holds now.
            await write_report(db, stalled, {replica.id: 2}, within_s=5, instance="test")
            await wait_until(
                lambda: pg_store.state.models[model].spec.replicas == 2, what="scaled up to 2"
            )
            with capture_logs() as logs:
                await db.execute(
                    "UPDATE gateway_reports SET reported_at = now() - interval '6 seconds' "
                    "WHERE gateway_id = $1",
                    stalled,
                )
                silent_from = reconciler.pass_count
                await wait_until(
                    lambda: reconciler.pass_count > silent_from + 20,
                    what="passes over several down windows",
                )
            assert pg_store.state.models[model].spec.replicas == 2
            figures = leader_figures(leader)
            assert (figures.gateways_reporting, figures.gateways_silent) == (1, 1)
            partial = [line for line in logs if line["event"] == "autoscale_demand_partial"]
            assert [(line["silent_gateways"], line["live_gateways"]) for line in partial] == [
                (1, 1)
            ]

            # Gone for good (its report removed, as a gateway stopping cleanly does): the
            # reporting gateway's word is the whole demand, and the count comes down.
            await delete_report(db, stalled, within_s=5, instance="test")
            await wait_until(
                lambda: pg_store.state.models[model].spec.replicas == 1, what="scaled down to 1"
            )
    finally:
        await delete_report(db, stalled, within_s=5, instance="test")
        await db.close()
        await gateway.close()


async def the_one_serving(pg_store: PostgresEventStore, model: str) -> Replica:
    """The model's only replica, once it serves."""
    await wait_until(
        lambda: [r.phase for r in replicas_of(pg_store, model)] == [ReplicaPhase.SERVING],
        what="the replica serving",
    )
    [replica] = replicas_of(pg_store, model)
    return replica


async def test_a_stopping_replica_ends_only_once_its_node_reports_its_engine_stopped(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore, operator: PostgresEventStore
) -> None:
    """An earlier leader placed the replica and its engine started, unrecorded: the log has
    the shard only placed. Its agent comes back with another port range and the engine
    still running at the log's port, so the replica is stopped. Before, the log had it
    stopped in the very pass that stopped it, its GPU free again under the engine."""
    reconciler = leader.reconciler
    assert reconciler is not None
    node_id = new_node_id()
    replica_id = await place_as_before(operator, node_id)
    engine = running_shard(replica_id, 20001, pid=4200, model=replica_id.rsplit("-", 1)[0])

    async with fake_agent(
        leader.hub.port, pki, node_id, shards=[engine], port_range=(20100, 20199), obeys=False
    ) as agent:
        await wait_until(lambda: agent.stops() != [], what="the engine's stop")
        passes = reconciler.pass_count
        await wait_until(lambda: reconciler.pass_count >= passes + 5, what="five more passes")

        history = await types_in(pg_store, replica_stream(replica_id))
        assert "replica_stopping" in history
        assert "replica_stopped" not in history
        assert [s.command_id for s in agent.stops()] == [f"stop-{replica_id}-0"]

        agent.shards.pop((replica_id, 0))
        await agent.say(
            ShardStatus(
                replica_id=replica_id,
                shard_index=0,
                state="stopped",
                pid=4200,
                port=20001,
                exit_code=0,
                command_id=f"stop-{replica_id}-0",
            )
        )

        async def stopped() -> bool:
            return "replica_stopped" in await types_in(pg_store, replica_stream(replica_id))

        await wait_until(stopped, what="the replica stopped, in the log")

    assert pg_store.state.replicas[replica_id].phase is ReplicaPhase.STOPPED


async def test_the_stop_of_a_second_copy_leaves_the_replica_whose_copy_came_up_alone(
    leader: Leader, pki: AgentPki, pg_store: PostgresEventStore, operator: PostgresEventStore
) -> None:
    """The log's copy came up at port 20001; the node's hello lists the shard at 20002,
    which adoption stops as a second copy. Before, the agent's ``stopped`` for it was
    recorded against the log's copy, and the replica failed "stopped without being asked
    to"."""
    reconciler = leader.reconciler
    assert reconciler is not None
    node_id = new_node_id()
    replica_id = await place_as_before(operator, node_id)
    for event in (
        ShardStarting(replica_id=replica_id, shard_index=0, node_id=node_id, pid=4100),
        ShardReady(replica_id=replica_id, shard_index=0, node_id=node_id),
    ):
        await record(operator, replica_stream(replica_id), event)
    second = running_shard(replica_id, 20002, pid=999, model=replica_id.rsplit("-", 1)[0])
    stray_stop = f"stray-{replica_id}-0-999"

    with capture_logs(processors=[merge_contextvars]) as logs:
        async with fake_agent(leader.hub.port, pki, node_id, shards=[second]) as agent:
            await wait_until(
                lambda: any(
                    e["event"] == "agent_command_completed" and e.get("command_id") == stray_stop
                    for e in logs
                ),
                what="the agent's answer to the stray's stop",
            )
            passes = reconciler.pass_count
            await wait_until(lambda: reconciler.pass_count >= passes + 5, what="five more passes")

    assert [s.command_id for s in agent.stops()] == [stray_stop]
    assert "stray_stopped" in await types_in(pg_store, node_stream(node_id))
    history = await types_in(pg_store, replica_stream(replica_id))
    assert "shard_stopped" not in history
    assert "replica_failed" not in history
    assert pg_store.state.models[replica_id.rsplit("-", 1)[0]].failures == 0
