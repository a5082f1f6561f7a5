"""A shard status's cause: kept only when it names a command sent to the node that reports;
a command result says in the same way whether it answers a command sent to its node.

Stories of agent sessions (sans-I/O) and of the log they feed, on the in-memory store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.domain import commands
from app.domain.events import replica_stream
from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings
from app.hub.commands_sent import CommandsSent
from app.hub.edge import command_to_wire, report_of
from app.hub.session import (
    AgentHello,
    AgentSession,
    CommandCompleted,
    Observe,
    Output,
    PeerCertificate,
    SessionState,
    ShardStatusReported,
)
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.memory import InMemoryEventStore
from wire.messages import (
    PROTOCOL_VERSION,
    CommandResult,
    GpuReport,
    Hello,
    ShardState,
    ShardStatus,
    StopShard,
    encode,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
OPERATOR = Caller(actor="alice", request_id="req-1")


def session_of(node_id: str, sent: CommandsSent | None = None) -> AgentSession:
    return connect(node_id, sent)[0]


def connect(node_id: str, sent: CommandsSent | None = None) -> tuple[AgentSession, AgentHello]:
    """A connection of ``node_id`` that said hello, listing one GPU, and what it observed."""
    session = AgentSession(
        peer=PeerCertificate(common_name=node_id, subject=f"CN={node_id}", kind="node"),
        remote_address="127.0.0.7:51234",
        require_identity=True,
        heartbeat_interval_s=5.0,
        heartbeat_timeout_s=15.0,
        server_id="cp-a",
        epoch=1,
        now=0.0,
        commands_sent=sent,
    )
    hello = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id,
        agent_version="t",
        address="127.0.0.7",
        port_range=(20000, 20999),
        gpus=(
            GpuReport(
                index=0,
                uuid=f"{node_id}-0",
                name="H100",
                memory_total_mib=81559,
                memory_used_mib=0,
                healthy=True,
            ),
        ),
    )
    [_, greeted] = session.receive(encode(hello), 0.0)
    assert isinstance(greeted, Observe)
    assert isinstance(greeted.observation, AgentHello)
    return session, greeted.observation


def status(state: ShardState, command_id: str | None, replica_id: str = "m-1") -> ShardStatus:
    return ShardStatus(
        replica_id=replica_id, shard_index=0, state=state, port=20000, command_id=command_id
    )


def observed(outputs: list[Output]) -> ShardStatusReported:
    [output] = outputs
    assert isinstance(output, Observe)
    assert isinstance(output.observation, ShardStatusReported)
    return output.observation


def stop(command_id: str, replica_id: str = "m-1") -> StopShard:
    return StopShard(command_id=command_id, replica_id=replica_id, shard_index=0, grace_s=5.0)


def test_a_status_naming_a_command_never_sent_goes_on_without_it_said_once() -> None:
    """Before, whatever id a status named went on as its cause: a node could say that an
    operator's request (or another node's command) made its shard fail."""
    session = session_of("gpu-1")

    first = observed(session.receive(encode(status("starting", "req-1")), 1.0))
    again = observed(session.receive(encode(status("ready", "stop-m-9-0")), 2.0))

    assert first == ShardStatusReported(
        node_id="gpu-1", status=status("starting", None), unsent_command_id="req-1"
    )
    assert again == ShardStatusReported(node_id="gpu-1", status=status("ready", None))


def test_a_status_names_a_command_sent_to_its_node_on_this_connection_or_an_earlier_one() -> None:
    sent = CommandsSent()
    earlier = session_of("gpu-1", sent)
    earlier.send_command(stop("stop-m-1-0"))
    later = session_of("gpu-1", sent)  # the agent reconnected while the engine stopped
    later.send_command(stop("stop-m-2-0", replica_id="m-2"))

    answers = [
        observed(later.receive(encode(status("stopped", "stop-m-1-0")), 1.0)),
        observed(later.receive(encode(status("stopped", "stop-m-2-0", "m-2")), 1.0)),
    ]

    assert [a.status.command_id for a in answers] == ["stop-m-1-0", "stop-m-2-0"]
    assert [a.unsent_command_id for a in answers] == [None, None]


def test_a_command_sent_to_another_node_is_no_cause_of_this_ones() -> None:
    sent = CommandsSent()
    session_of("gpu-2", sent).send_command(stop("stop-m-1-0"))
    liar = session_of("gpu-1", sent)

    answer = observed(liar.receive(encode(status("stopped", "stop-m-1-0")), 1.0))

    assert (answer.status.command_id, answer.unsent_command_id) == (None, "stop-m-1-0")


def test_a_command_result_says_whether_its_command_was_sent_to_its_node() -> None:
    """Only the answer to a command this control plane sent the node can fail the shard it
    starts: a node cannot fail another node's shard, or one it was never told to start."""
    sent = CommandsSent()
    session_of("gpu-2", sent).send_command(stop("stop-m-2-0", replica_id="m-2"))
    earlier = session_of("gpu-1", sent)
    earlier.send_command(stop("stop-m-1-0"))

    answers = {}
    for command_id in ("stop-m-1-0", "stop-m-2-0", "start-m-1-0"):
        later = session_of("gpu-1", sent)  # the agent answers on a later connection
        result = CommandResult(command_id=command_id, ok=False, error="no")
        [output] = later.receive(encode(result), 1.0)
        assert isinstance(output, Observe)
        assert isinstance(output.observation, CommandCompleted)
        answers[command_id] = output.observation.sent

    assert answers == {"stop-m-1-0": True, "stop-m-2-0": False, "start-m-1-0": False}


def test_of_the_results_of_commands_never_sent_only_the_first_of_a_connection_goes_on() -> None:
    """Before, every one went on to be logged with its error of up to 2,000 characters: a
    node answering commands it was never sent wrote a line per message, 50 a second, for as
    long as it liked. They change nothing, so the first of a connection is enough to say it;
    the answers to commands sent go on, every one."""
    sent = CommandsSent()
    session = session_of("gpu-1", sent)
    session.send_command(stop("stop-m-1-0"))

    def passed_on(command_id: str) -> list[str]:
        result = CommandResult(command_id=command_id, ok=False, error="x" * 2000)
        return [
            output.observation.result.command_id
            for output in session.receive(encode(result), 1.0)
            if isinstance(output, Observe) and isinstance(output.observation, CommandCompleted)
        ]

    made_up = [passed_on(f"made-up-{n}") for n in range(100)]
    assert made_up == [["made-up-0"]] + [[]] * 99
    assert passed_on("stop-m-1-0") == ["stop-m-1-0"]
    assert passed_on("stop-m-1-0") == ["stop-m-1-0"]
    assert session.state is SessionState.ACTIVE
    made_up_again = CommandResult(command_id="made-up-0", ok=False)
    assert session_of("gpu-1", sent).receive(encode(made_up_again), 2.0) == [
        Observe(CommandCompleted(node_id="gpu-1", result=made_up_again, sent=False))
    ], "a new connection says it again"


def test_the_memory_keeps_each_nodes_most_recent_commands() -> None:
    sent = CommandsSent(per_node=2)
    for command_id in ("a", "b", "a", "c"):
        sent.sent("gpu-1", command_id)
    assert [sent.knows("gpu-1", c) for c in ("a", "b", "c")] == [True, False, True]
    assert not sent.knows("gpu-2", "a")


class AgentLink:
    """The hub's part, reduced to one connection: commands go out through its session."""

    def __init__(self, session: AgentSession) -> None:
        self.session = session

    async def send_command(
        self, node_id: str, command: commands.StartShard | commands.StopShard
    ) -> None:
        assert node_id == self.session.node_id
        self.session.send_command(command_to_wire(command))


async def test_the_log_keeps_the_cause_a_status_names_only_if_its_node_was_sent_it() -> None:
    """A placed shard's node answers the start it was sent, then says its engine's readiness
    was caused by an operator's request. Before, the log kept that as the event's cause."""
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    operations = Operations(store, clock=lambda: T0)
    session, hello = connect("gpu-1")
    await view.handle(report_of(hello))
    await operations.apply_model(OPERATOR, ModelSpec(name="llama", command="sim --port {port}"))
    settings = Settings(epoch=1, started_at=T0 - timedelta(hours=1))
    placed = await Reconciler(store, AgentLink(session), view, settings).run_pass()
    assert placed.sent == 1
    [replica_id] = store.state.replicas

    said: list[tuple[ShardState, str]] = [("starting", f"start-{replica_id}-0"), ("ready", "req-1")]
    for state, cause in said:
        await view.handle(
            report_of(observed(session.receive(encode(status(state, cause, replica_id)), 1.0)))
        )

    recorded = {
        r.event.__class__.__name__: r.meta.causation_id
        for r in await store.read_stream(replica_stream(replica_id))
    }
    assert recorded == {
        "ReplicaPlaced": None,
        "ShardStarting": f"start-{replica_id}-0",  # the start the node was sent
        "ShardReady": None,  # not the operator's request, whatever the node says
    }
