"""The fleet end to end, from an agent process to the event log.

Real ``llmgw-agent`` processes with fake GPUs run the real ``llmgw-sim-engine`` and dial the
control plane's own ``AgentHub`` over mutual TLS, with certificates made by the
``llmgw-cli cert`` commands an operator runs. The hub hands what agents report to the real
``ReportRecorder``, which appends to PostgreSQL. Every story is checked in the log and in the
projections, never only in memory. Agents and engines are killed when a test ends, passed
or not.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain import commands
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    GpuMarkedUnhealthy,
    GpuRecovered,
    ModelDeclared,
    NodeConnected,
    ReplicaPlaced,
    ShardFailed,
    ShardPlacement,
    ShardStarting,
    event_type,
    model_stream,
    node_stream,
    replica_id_for,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.domain.reports import AgentConnected, AgentReport, HeartbeatReport, ShardStatusReport
from app.hub.hub import AgentHub
from app.pki.tls import server_ssl_context
from app.services.agent_reports import ReportRecorder, agent_actor
from app.store.interface import NO_STREAM, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.fleet import (
    LOOPBACK,
    AgentProcess,
    FleetProcesses,
    NodeCredentials,
    clear_fake_gpu,
    is_running,
    mark_fake_gpu,
    simulator_start,
)
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

NODE_ID = "gpu-01"
MODEL = "sim-model"
CLI = str(Path(sys.executable).parent / "llmgw-cli")
WITHIN_S = 15.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA, a server certificate for 127.0.0.1 and the node's, made as the docs say."""
    directory = tmp_path_factory.mktemp("fleet-pki")
    for command in (
        ("init-ca", "--name", "llmgw CA fleet story"),
        ("server", "--ip", LOOPBACK),
        ("node", NODE_ID),
    ):
        subprocess.run(
            [CLI, "cert", *command, "--dir", str(directory)],
            capture_output=True,
            check=True,
            timeout=60,
        )
    return directory


@dataclass(eq=False)
class WatchedRecorder:
    """The real ``ReportRecorder``, and every report the hub handed it (the hello's shard
    list, for one, is nowhere in the log)."""

    recorder: ReportRecorder
    seen: list[AgentReport] = field(default_factory=list)

    async def handle(self, report: AgentReport) -> None:
        self.seen.append(report)
        await self.recorder.handle(report)

    def mark(self) -> int:
        """A place in the reports: ``observed(..., since=mark)`` looks only after it."""
        return len(self.seen)

    async def observed(
        self, kind: type[T], matches: Callable[[T], bool], *, since: int, what: str
    ) -> T:
        found: list[T] = []

        def check() -> bool:
            found[:] = [o for o in self.seen[since:] if isinstance(o, kind) and matches(o)]
            return bool(found)

        await wait_until(check, within_s=WITHIN_S, what=what)
        return found[0]

    def engine_pids(self) -> set[int]:
        """Every engine pid an agent reported, in a status or in its hello."""
        pids: set[int] = set()
        for report in self.seen:
            if isinstance(report, ShardStatusReport) and report.phase.pid:
                pids.add(report.phase.pid)
            if isinstance(report, AgentConnected):
                pids.update(shard.pid for shard in report.shards if shard.pid)
        return pids


@dataclass(eq=False)
class Fleet:
    """One control plane (hub, service, store), the node's agents, and the log to read."""

    hub: AgentHub
    service: WatchedRecorder
    store: PostgresEventStore
    database: AsyncEngine
    processes: FleetProcesses
    credentials: NodeCredentials
    state_dir: Path

    def start_agent(self) -> AgentProcess:
        return self.processes.start_agent(
            f"wss://{LOOPBACK}:{self.hub.port}", NODE_ID, self.credentials, self.state_dir
        )

    async def event_types(self, stream: str) -> list[str]:
        return [event_type(recorded.event) for recorded in await self.store.read_stream(stream)]

    async def recorded(self, stream: str, kind: str, *, count: int = 1) -> Recorded:
        """Wait until ``stream`` holds ``count`` events of type ``kind``; the last of them."""
        found: list[Recorded] = []

        async def check() -> bool:
            records = await self.store.read_stream(stream)
            found[:] = [r for r in records if event_type(r.event) == kind]
            return len(found) >= count

        await wait_until(check, within_s=WITHIN_S, what=f"{count} x {kind} on {stream}")
        return found[count - 1]

    async def connected(self, *, count: int = 1) -> NodeConnected:
        recorded = await self.recorded(node_stream(NODE_ID), "node_connected", count=count)
        assert isinstance(recorded.event, NodeConnected)
        return recorded.event

    async def place_replica(self, port: int) -> str:
        """Declare the model and place its first replica on the node, as the reconciler
        would; the replica's id."""
        spec = ModelSpec(name=MODEL, command="llmgw-sim-engine --port {port} --model {model}")
        replica_id = replica_id_for(MODEL, 1)
        placed = ReplicaPlaced(
            replica_id=replica_id,
            model=MODEL,
            number=1,
            shards=(ShardPlacement(index=0, node_id=NODE_ID, gpus=(1,), port=port),),
        )
        reconciler = Meta(actor="reconciler")
        declared = NewEvent(ModelDeclared(model=MODEL, spec=spec))
        await self.store.append(model_stream(MODEL), NO_STREAM, [declared], reconciler)
        await self.store.append(
            replica_stream(replica_id), NO_STREAM, [NewEvent(placed)], reconciler
        )
        return replica_id

    async def start_simulator(self, replica_id: str, port: int, *flags: str) -> int:
        """Send ``start_shard`` for the simulator through the hub; the pid it starts with."""
        await self.hub.send_command(
            NODE_ID, simulator_start(f"start-{replica_id}", replica_id, port, *flags, model=MODEL)
        )
        starting = await self.recorded(replica_stream(replica_id), "shard_starting")
        assert isinstance(starting.event, ShardStarting)
        assert starting.event.pid is not None
        return starting.event.pid

    async def row(self, query: str, **params: object) -> dict[str, object]:
        """The one row ``query`` selects from the projections, by column name."""
        async with self.database.connect() as connection:
            return dict((await connection.execute(text(query), params)).mappings().one())


@pytest_asyncio.fixture(loop_scope="session")
async def fleet(
    pki: Path, pg_store: PostgresEventStore, engine: AsyncEngine, tmp_path: Path
) -> AsyncIterator[Fleet]:
    service = WatchedRecorder(ReportRecorder(pg_store))
    context = server_ssl_context(pki / "server.crt", pki / "server.key", pki / "ca.crt")
    # Short, so that an agent that dies without a word counts as gone within the story.
    hub = AgentHub(
        service, context, heartbeat_interval_s=1.0, heartbeat_timeout_s=3.0, server_id="story"
    )
    await hub.start(LOOPBACK, 0)
    processes = FleetProcesses(tmp_path)
    credentials = NodeCredentials(
        pki / f"node-{NODE_ID}.crt", pki / f"node-{NODE_ID}.key", pki / "ca.crt"
    )
    try:
        yield Fleet(
            hub, service, pg_store, engine, processes, credentials, tmp_path / "agent-state"
        )
    finally:
        try:
            processes.reap(service.engine_pids())
        finally:
            await hub.stop()
        for agent in processes.agents:
            print(f"--- agent {agent.pid} ---\n{agent.log()}")  # shown when a story fails


# -- stories -----------------------------------------------------------------------------


async def test_an_agent_with_two_fake_gpus_registers_and_is_connected(fleet: Fleet) -> None:
    fleet.start_agent()

    connected = await fleet.connected()

    records = await fleet.store.read_stream(node_stream(NODE_ID))
    assert [event_type(r.event) for r in records] == ["node_registered", "node_connected"]
    assert {r.meta.actor for r in records} == {agent_actor(NODE_ID)}
    assert connected.address == LOOPBACK
    assert [(gpu.index, gpu.memory_total_mib, gpu.healthy) for gpu in connected.gpus] == [
        (0, 80 * 1024, True),
        (1, 80 * 1024, True),
    ]
    node = await fleet.row(
        "SELECT connected, gpu_count, healthy_gpu_count FROM nodes WHERE id = :id", id=NODE_ID
    )
    assert node == {"connected": True, "gpu_count": 2, "healthy_gpu_count": 2}


async def test_a_placed_simulator_shard_starts_becomes_ready_and_stops(fleet: Fleet) -> None:
    fleet.start_agent()
    await fleet.connected()
    port = free_port()
    replica_id = await fleet.place_replica(port)
    stream = replica_stream(replica_id)

    engine_pid = await fleet.start_simulator(replica_id, port)
    ready = await fleet.recorded(stream, "shard_ready")

    assert await fleet.event_types(stream) == ["replica_placed", "shard_starting", "shard_ready"]
    assert ready.meta.actor == agent_actor(NODE_ID)
    assert ready.meta.causation_id == f"start-{replica_id}"  # the command it answers
    assert is_running(engine_pid)
    shard = await fleet.row(
        "SELECT node_id, phase, pid FROM shards WHERE replica_id = :id AND shard_index = 0",
        id=replica_id,
    )
    assert shard == {"node_id": NODE_ID, "phase": "ready", "pid": engine_pid}

    stop = commands.StopShard(
        command_id=f"stop-{replica_id}", replica_id=replica_id, shard_index=0, grace_s=5
    )
    await fleet.hub.send_command(NODE_ID, stop)
    stopped = await fleet.recorded(stream, "shard_stopped")

    assert stopped.meta.actor == agent_actor(NODE_ID)
    await wait_until(lambda: not is_running(engine_pid), what="the engine process is gone")
    phase = await fleet.row("SELECT phase FROM shards WHERE replica_id = :id", id=replica_id)
    assert phase == {"phase": "stopped"}


async def test_a_simulator_that_exits_is_recorded_failed_with_its_error_line(
    fleet: Fleet,
) -> None:
    fleet.start_agent()
    await fleet.connected()
    port = free_port()
    replica_id = await fleet.place_replica(port)

    await fleet.start_simulator(replica_id, port, "--exit-after", "0.5")
    failed = await fleet.recorded(replica_stream(replica_id), "shard_failed")

    error_line = "simulated engine failure: exiting 0.5 s after start (--exit-after)"
    assert isinstance(failed.event, ShardFailed)
    assert failed.meta.actor == agent_actor(NODE_ID)
    assert failed.event.exit_code == 3
    assert failed.event.error == "engine exited with code 3"
    assert any(error_line in line for line in failed.event.log_tail), failed.event.log_tail
    shard = await fleet.row(
        "SELECT phase, exit_code, log_tail FROM shards WHERE replica_id = :id", id=replica_id
    )
    assert shard == {"phase": "failed", "exit_code": 3, "log_tail": list(failed.event.log_tail)}


async def test_a_fake_gpu_marked_unhealthy_and_cleared_is_recorded_both_ways(
    fleet: Fleet,
) -> None:
    fleet.start_agent()
    await fleet.connected()
    stream = node_stream(NODE_ID)
    reason = "XID 79: GPU has fallen off the bus"

    assert await mark_fake_gpu(fleet.state_dir, 1, reason) == 0
    marked = await fleet.recorded(stream, "gpu_marked_unhealthy")

    assert isinstance(marked.event, GpuMarkedUnhealthy)
    assert (marked.event.gpu_index, marked.event.reason, marked.event.xid) == (1, reason, 79)
    assert marked.meta.actor == agent_actor(NODE_ID)
    healthy = "SELECT healthy_gpu_count FROM nodes WHERE id = :id"
    assert await fleet.row(healthy, id=NODE_ID) == {"healthy_gpu_count": 1}

    assert await clear_fake_gpu(fleet.state_dir, 1) == 0
    recovered = await fleet.recorded(stream, "gpu_recovered")

    assert isinstance(recovered.event, GpuRecovered)
    assert recovered.event.gpu_index == 1
    assert recovered.event.gpu_uuid == marked.event.gpu_uuid
    assert await fleet.row(healthy, id=NODE_ID) == {"healthy_gpu_count": 2}


async def test_a_killed_agent_is_disconnected_and_its_successor_reattaches_the_engine(
    fleet: Fleet,
) -> None:
    first = fleet.start_agent()
    await fleet.connected()
    port = free_port()
    replica_id = await fleet.place_replica(port)
    engine_pid = await fleet.start_simulator(replica_id, port)
    await fleet.recorded(replica_stream(replica_id), "shard_ready")

    first.kill()
    await wait_until(first.exited, what="the first agent is dead")
    disconnected = await fleet.recorded(node_stream(NODE_ID), "node_disconnected")

    assert disconnected.meta.actor == agent_actor(NODE_ID)
    connected = "SELECT connected FROM nodes WHERE id = :id"
    assert await fleet.row(connected, id=NODE_ID) == {"connected": False}
    assert is_running(engine_pid), "the engine outlives its agent"

    since = fleet.service.mark()
    fleet.start_agent()
    await fleet.connected(count=2)
    hello = await fleet.service.observed(
        AgentConnected, lambda _: True, since=since, what="a hello"
    )
    assert [(s.replica_id, s.pid) for s in hello.shards] == [(replica_id, engine_pid)]
    await fleet.service.observed(
        HeartbeatReport,
        lambda o: [(r, state) for r, _, state in o.shard_states] == [(replica_id, "ready")],
        since=since,
        what="the re-attached engine ready again",
    )

    assert await fleet.event_types(node_stream(NODE_ID)) == [
        "node_registered",
        "node_connected",
        "node_disconnected",
        "node_connected",
    ]
    assert await fleet.event_types(replica_stream(replica_id)) == [
        "replica_placed",
        "shard_starting",
        "shard_ready",
    ]
    assert await fleet.row(connected, id=NODE_ID) == {"connected": True}
    shard = await fleet.row("SELECT phase, pid FROM shards WHERE replica_id = :id", id=replica_id)
    assert shard == {"phase": "ready", "pid": engine_pid}
    assert is_running(engine_pid)
