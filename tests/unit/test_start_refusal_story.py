"""A start refused by its node, through the agent protocol: the agent's session and the hub's
talk through encode/decode (no socket), the agent judges the start with its own checks
(``agent.runtime.start_refusal``), and the hub's observations reach the live view and the
log (in-memory store) as they do in ``serve``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent import session as agent_side
from agent.gpu_reports import VANISHED_GPU_REASON
from agent.gpus import GpuStatus
from agent.runtime import start_refusal
from agent.session import CommandLedger, ServerSession
from app.domain import commands
from app.domain.describe import describe
from app.domain.events import ReplicaFailed, ShardFailed, replica_stream
from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings
from app.domain.state import ReplicaPhase
from app.hub import session as hub_side
from app.hub.commands_sent import CommandsSent
from app.hub.edge import command_to_wire, report_of
from app.hub.session import AgentSession, Observation, PeerCertificate
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.memory import InMemoryEventStore
from wire.messages import PROTOCOL_VERSION, GpuReport, Hello, StartShard, encode

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
PORT_RANGE = (20000, 20999)
HELLO = Hello(
    protocol_version=PROTOCOL_VERSION,
    node_id="gpu-1",
    agent_version="t",
    address="127.0.0.7",
    port_range=PORT_RANGE,
    gpus=(
        GpuReport(
            index=0,
            uuid="GPU-0",
            name="H100",
            memory_total_mib=81559,
            memory_used_mib=0,
            healthy=True,
        ),
    ),
)
GONE = GpuStatus(
    index=0, uuid="GPU-0", name="H100", memory_total_mib=81559, memory_used_mib=0, listed=False
)
"""GPU 0 as the agent sees it when the start comes: dropped out of the driver's listing
since its hello (its heartbeat saying so is still on its way)."""
REFUSAL = f"GPU(s) [0] are {VANISHED_GPU_REASON}"


class Node:
    """One agent connected to the hub, both sessions in memory: what either sends, the
    other receives as bytes. The agent runs no engine: it judges each start it executes
    with its own checks and answers it."""

    def __init__(self, ledger: CommandLedger, sent: CommandsSent) -> None:
        self.agent = ServerSession(
            node_id="gpu-1", hello_factory=lambda: HELLO, now=0.0, commands=ledger
        )
        self.hub = AgentSession(
            peer=PeerCertificate(common_name="gpu-1", subject="CN=gpu-1", kind="node"),
            remote_address="127.0.0.7:51234",
            require_identity=True,
            heartbeat_interval_s=5.0,
            heartbeat_timeout_s=15.0,
            server_id="cp-a",
            epoch=1,
            now=0.0,
            commands_sent=sent,
        )
        self.observed: list[Observation] = []
        self.executed: list[StartShard] = []
        self._from_agent(self.agent.opened(0.0))

    async def send_command(
        self, node_id: str, command: commands.StartShard | commands.StopShard
    ) -> None:
        """The hub's part for the reconciler: the command goes out through this session."""
        assert node_id == "gpu-1"
        self._from_hub(self.hub.send_command(command_to_wire(command)))

    def _from_agent(self, outputs: list[agent_side.Output]) -> None:
        for output in outputs:
            match output:
                case agent_side.Send(message=message):
                    self._from_hub(self.hub.receive(encode(message), 1.0))
                case agent_side.Execute(command=StartShard() as start):
                    self.executed.append(start)
                    refused = start_refusal(start, PORT_RANGE, [GONE], [])
                    assert refused is not None
                    self._from_agent(self.agent.command_finished(start.command_id, False, refused))
                case _:
                    raise AssertionError(f"unexpected {output!r}")

    def _from_hub(self, outputs: list[hub_side.Output]) -> None:
        for output in outputs:
            match output:
                case hub_side.Send(message=message):
                    self._from_agent(self.agent.receive(encode(message), 1.0))
                case hub_side.Observe(observation=observation):
                    self.observed.append(observation)
                case _:
                    raise AssertionError(f"unexpected {output!r}")

    async def reported_to(self, view: LiveView) -> None:
        """What the hub observed so far, handed on as ``serve``'s hub does."""
        observed, self.observed = self.observed, []
        for observation in observed:
            await view.handle(report_of(observation))


async def test_a_start_the_agent_refuses_fails_its_replica_at_once_with_the_agents_reason() -> None:
    """Before, the refusal was only logged: the replica stayed placed until its startup
    timeout, ten minutes later, and its history said it timed out starting."""
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store, epoch=1))
    operations = Operations(store, clock=lambda: T0)
    ledger, sent = CommandLedger(), CommandsSent()
    node = Node(ledger, sent)
    await node.reported_to(view)
    await operations.apply_model(
        Caller(actor="alice", request_id="req-1"),
        ModelSpec(name="llama", command="sim --port {port}"),
    )
    reconciler = Reconciler(
        store, node, view, Settings(epoch=1, started_at=T0 - timedelta(hours=1))
    )

    assert (await reconciler.run_pass()).sent == 1
    [replica_id] = store.state.replicas
    start = f"start-{replica_id}-0"
    assert [c.command_id for c in node.executed] == [start]
    await node.reported_to(view)
    await reconciler.run_pass()

    replica = store.state.replicas[replica_id]
    assert replica.phase is ReplicaPhase.FAILED
    assert replica.shards[0].error == f"start refused: {REFUSAL}"
    assert store.state.models["llama"].failures == 1  # the backoff counts it
    history = await store.read_stream(replica_stream(replica_id))
    [shard_failed] = [r for r in history if isinstance(r.event, ShardFailed)]
    assert (shard_failed.meta.actor, shard_failed.meta.causation_id) == ("agent:gpu-1", start)
    assert describe(shard_failed.event) == (
        f"replica {replica_id} shard 0 failed on gpu-1: start refused: {REFUSAL}"
    )
    assert [type(r.event) for r in history][-1] is ReplicaFailed

    # The agent reconnects and is sent the same start again: it answers with the refusal
    # it remembers, runs nothing, and the log records the failure once.
    again = Node(ledger, sent)
    await again.reported_to(view)
    await again.send_command("gpu-1", _start_of(store, replica_id))
    assert again.executed == []
    await again.reported_to(view)

    assert await store.read_stream(replica_stream(replica_id)) == history


def _start_of(store: InMemoryEventStore, replica_id: str) -> commands.StartShard:
    state = store.state
    replica = state.replicas[replica_id]
    spec = state.models[replica.model].spec_of(replica.revision)
    return commands.start_command(state, spec, replica, replica.shards[0])
