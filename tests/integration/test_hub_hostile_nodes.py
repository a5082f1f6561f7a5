"""A node with a valid certificate that lies in what it names, or stops reading what it is
sent, tried over real mTLS WebSockets against a real PostgreSQL: it costs its own
connection, and neither the log nor the other nodes pay for it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from time import monotonic
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame
from websockets.protocol import State
from websockets.uri import parse_uri

from app.domain.commands import NodeNotConnected, StartShard, start_command_id
from app.domain.decision import Command
from app.domain.envelope import Meta
from app.domain.events import (
    ModelDeclared,
    ReplicaPlaced,
    ShardPlacement,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.domain.revocations import PresentedCertificate
from app.hub.edge import command_to_wire
from app.hub.hub import CLOSE_TIMEOUT_S, SEND_TIMEOUT_S, AgentHub
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.command_sending import CommandSender
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.hub import (
    DEADLINE_S,
    LOOPBACK,
    Pki,
    RunHub,
    close_code,
    dial,
    event_types,
    gpu,
    greet,
    hear,
    hello,
    hello_apart,
    hub,
    new_node_id,
    pki,
    run_hub,
    say,
    stream_is,
)
from tests.support.waiting import wait_until
from wire.messages import (
    CommandResult,
    Heartbeat,
    HeartbeatAck,
    HeartbeatShard,
    ServerMessage,
    ShardReport,
    ShardState,
    ShardStatus,
    encode,
)
from wire.messages import StartShard as WireStartShard

__all__ = ["hub", "pki", "run_hub"]  # fixtures

GHOST = ShardReport(
    replica_id="ghost-1",
    shard_index=0,
    model="ghost",
    port=20001,
    gpus=(0,),
    pid=4242,
    state="ready",
    started_at=datetime(2025, 3, 1, 12, 30, tzinfo=UTC),
)

NAMES_WITH_CONTROLS: dict[str, tuple[dict[str, Any], str]] = {
    "a NUL in a shard's replica id": (
        {"shards": (msgspec.structs.replace(GHOST, replica_id="ghost\x00-1"),)},
        "$.shards[0].replica_id",
    ),
    "an escape sequence in a label": ({"labels": {"zone": "a\x1b]0;pwned\x07"}}, "$.labels"),
    "a line break in a GPU's UUID": (
        {"gpus": (msgspec.structs.replace(gpu(0), uuid="GPU-0\nGPU-1"),)},
        "$.gpus[0].uuid",
    ),
    "a NUL in a shard's model": (
        {"shards": (msgspec.structs.replace(GHOST, model="gho\x00st"),)},
        "$.shards[0].model",
    ),
}


async def answer(agent: ClientConnection) -> ServerMessage | None:
    """What the hub answered, or None when it closed the connection instead."""
    try:
        return await hear(agent)
    except ConnectionClosed:
        return None


@pytest.mark.parametrize("case", sorted(NAMES_WITH_CONTROLS))
async def test_a_hello_naming_something_with_a_control_character_is_malformed(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, case: str
) -> None:
    """Before, a hello listing a stray shard named ``ghost\\x00-1`` was welcomed. The log keeps
    a NUL as U+FFFD, so the stray's record never matched the shard reported, and the
    reconciler recorded it again at every pass, for ever. Now a name holding a control
    character is malformed: 1002 naming the field, nothing recorded."""
    change, path = NAMES_WITH_CONTROLS[case]
    node_id = new_node_id()
    async with dial(hub, pki.node(node_id)) as agent:
        await say(agent, msgspec.structs.replace(hello(node_id), **change))
        assert await answer(agent) is None, "the hello was answered"
        assert await close_code(agent) == 1002
        assert path in (agent.close_reason or "")
    assert await event_types(pg_store, node_stream(node_id)) == []
    assert hub.connected_nodes() == []


@pytest.mark.parametrize(
    "message",
    [
        ShardStatus(replica_id="ghost\x00-1", shard_index=0, state="ready", port=20001),
        Heartbeat(
            seq=1, shards=(HeartbeatShard(replica_id="g\x1b[2J", shard_index=0, state="ready"),)
        ),
    ],
    ids=["a status", "a heartbeat"],
)
async def test_a_report_naming_a_shard_with_a_control_character_closes_that_connection(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, message: ShardStatus | Heartbeat
) -> None:
    liar_id, honest_id = new_node_id(), new_node_id()
    async with dial(hub, pki.node(honest_id)) as honest, dial(hub, pki.node(liar_id)) as liar:
        await greet(honest, honest_id)
        await greet(liar, liar_id)
        await say(liar, message)
        with contextlib.suppress(ConnectionClosed):
            await say(liar, Heartbeat(seq=9))
        assert await answer(liar) is None, "the connection went on"
        assert await close_code(liar) == 1002
        assert "replica_id" in (liar.close_reason or "")
        await say(honest, Heartbeat(seq=1))
        assert await hear(honest) == HeartbeatAck(seq=1)
        assert hub.connected_nodes() == [honest_id]


async def placed_on(store: PostgresEventStore, node_id: str) -> str:
    """A replica of a new model placed on ``node_id`` at port 20001, as the reconciler
    records it; its id."""
    model = f"m-{uuid.uuid4().hex[:8]}"
    replica_id = f"{model}-1"
    spec = ModelSpec(name=model, command="llmgw-sim-engine --port {port}", replicas=1)
    placement = ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20001)
    placed = ReplicaPlaced(replica_id=replica_id, model=model, number=1, shards=(placement,))
    await store.append_many(
        [
            AppendRequest(
                model_stream(model), None, [NewEvent(ModelDeclared(model=model, spec=spec))]
            ),
            AppendRequest(replica_stream(replica_id), None, [NewEvent(placed)]),
        ],
        Meta(actor="reconciler"),
    )
    return replica_id


async def test_what_a_node_says_of_another_nodes_shard_and_command_records_nothing(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """A node reports the shard placed on its neighbour ready, failed and stopped, and
    answers the start its neighbour was sent as refused: none of it is the log's."""
    liar_id, honest_id = new_node_id(), new_node_id()
    async with dial(hub, pki.node(honest_id)) as honest, dial(hub, pki.node(liar_id)) as liar:
        await greet(honest, honest_id)
        await greet(liar, liar_id)
        for node_id in (honest_id, liar_id):
            await wait_until(
                stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"])
            )
        replica_id = await placed_on(pg_store, honest_id)
        start = msgspec.structs.replace(
            big_start(0), command_id=start_command_id(replica_id, 0), replica_id=replica_id
        )
        await hub.send_command(honest_id, msgspec.structs.replace(start, argv=("e",)))
        assert isinstance(await hear(honest), WireStartShard)

        states: tuple[ShardState, ...] = ("ready", "failed", "stopped")
        for state in states:
            lie = ShardStatus(
                replica_id=replica_id,
                shard_index=0,
                state=state,
                port=20001,
                command_id=start.command_id,
            )
            await say(liar, lie)
        await say(liar, CommandResult(command_id=start.command_id, ok=False, error="refused"))
        await say(liar, Heartbeat(seq=1))
        assert await hear(liar) == HeartbeatAck(seq=1)  # every lie before it was handled

        assert await event_types(pg_store, replica_stream(replica_id)) == ["replica_placed"]
        assert await event_types(pg_store, node_stream(liar_id)) == [
            "node_registered",
            "node_connected",
        ]
        assert sorted(hub.connected_nodes()) == sorted([honest_id, liar_id])


async def test_answers_to_commands_never_sent_are_logged_once_a_connection(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """Before, each was logged with its error: 100 answers, 100 lines of 2,000 characters."""
    node_id = new_node_id()
    with capture_logs() as logs:
        async with dial(hub, pki.node(node_id)) as agent:
            await greet(agent, node_id)
            for number in range(100):
                result = CommandResult(command_id=f"made-up-{number}", ok=False, error="x" * 2000)
                await say(agent, result)
            await say(agent, Heartbeat(seq=1))
            assert await hear(agent) == HeartbeatAck(seq=1)  # every answer before it was read
    lines = [e for e in logs if e["event"] == "agent_command_completed"]
    assert [e["command_id"] for e in lines] == ["made-up-0"]
    await wait_until(
        stream_is(
            pg_store,
            node_stream(node_id),
            ["node_registered", "node_connected", "node_disconnected"],
        ),
        what="nothing recorded but the connection",
    )


@asynccontextmanager
async def deaf_agent(hub: AgentHub, context: ssl.SSLContext, node_id: str) -> AsyncIterator[None]:
    """An agent that says hello, reads its welcome, and then reads nothing more: what the hub
    sends it piles up in the sockets' buffers (a client library would read it on its own)."""
    reader, writer = await asyncio.open_connection(LOOPBACK, hub.port, ssl=context)
    protocol = ClientProtocol(parse_uri(f"wss://{LOOPBACK}:{hub.port}"))
    try:
        protocol.send_request(protocol.connect())
        writer.write(b"".join(protocol.data_to_send()))
        async with asyncio.timeout(DEADLINE_S):
            while protocol.state is not State.OPEN:
                protocol.receive_data(await reader.read(65536))
            protocol.send_text(encode(hello(node_id)))
            writer.write(b"".join(protocol.data_to_send()))
            while not any(isinstance(e, Frame) for e in protocol.events_received()):
                protocol.receive_data(await reader.read(65536))
        yield
    finally:
        writer.transport.abort()


def big_start(number: int) -> StartShard:
    """A start whose command line takes half a MiB: the channel carries up to 1 MiB."""
    return StartShard(
        command_id=f"start-big-{number}-0",
        replica_id=f"big-{number}",
        shard_index=0,
        model="big",
        argv=("engine", "x" * 512 * 1024),
        env={},
        gpus=(0,),
        port=20001,
    )


async def test_a_node_that_reads_nothing_it_is_sent_holds_up_no_one_else(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """Before, once a node that reads nothing had filled its socket's buffers, a command to
    it waited for as long as the node liked (the keepalive's ping waited behind it too): the
    reconciler, which sends every node's commands in turn, never sent another. Now a send
    that waits 2 s (``SEND_TIMEOUT_S``) drops that connection, the node is disconnected, and
    the next node's command goes at once."""
    deaf_id, honest_id = new_node_id(), new_node_id()
    async with (
        dial(hub, pki.node(honest_id)) as honest,
        deaf_agent(hub, pki.node(deaf_id), deaf_id),
    ):
        await greet(honest, honest_id)

        async def fill_up() -> None:
            for number in range(200):  # 100 MiB: far past what any socket buffers
                await hub.send_command(deaf_id, big_start(number))

        sending = asyncio.create_task(fill_up())
        try:
            done, _ = await asyncio.wait({sending}, timeout=DEADLINE_S)
            assert sending in done, "a command to a node that reads nothing held up its sender"
            with pytest.raises(NodeNotConnected):
                sending.result()
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, NodeNotConnected):
                await sending

        await hub.send_command(honest_id, msgspec.structs.replace(big_start(0), argv=("e",)))
        assert isinstance(await hear(honest), WireStartShard)
        assert hub.connected_nodes() == [honest_id]
        await wait_until(
            stream_is(
                pg_store,
                node_stream(deaf_id),
                ["node_registered", "node_connected", "node_disconnected"],
            ),
            what="the node that reads nothing marked disconnected",
        )


async def test_a_command_to_a_healthy_node_does_not_wait_behind_one_that_reads_nothing(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """Before, a pass's commands went one after another: once a node that reads nothing had
    filled its buffers, the next node's command waited up to 2 s (``SEND_TIMEOUT_S``) for
    that connection to be dropped, at every pass the node reconnected for. Now each node's
    commands go in their own order, beside the others'."""
    view = LiveView(ReportRecorder(pg_store))
    deaf_id, honest_id = new_node_id(), new_node_id()
    async with (
        run_hub(handler=view) as hub,
        dial(hub, pki.node(honest_id)) as honest,
        deaf_agent(hub, pki.node(deaf_id), deaf_id),
    ):
        await greet(honest, honest_id)
        await wait_until(lambda: None not in (view.greeting(deaf_id), view.greeting(honest_id)))
        sender = CommandSender(hub, view, lambda: datetime.now(UTC))
        fills = [Command(node_id=deaf_id, command=big_start(n)) for n in range(200)]
        small = msgspec.structs.replace(big_start(0), command_id="start-small-0", argv=("e",))
        deaf_first = [*fills, Command(node_id=honest_id, command=small)]

        sending = asyncio.create_task(sender.send(deaf_first))
        hearing = asyncio.create_task(hear(honest))
        try:
            done, _ = await asyncio.wait({hearing}, timeout=SEND_TIMEOUT_S / 2)
            assert hearing in done, "the healthy node's command waited behind the deaf node's"
            assert await hearing == command_to_wire(small)
            async with asyncio.timeout(DEADLINE_S):
                sent = await sending
        finally:
            for task in (sending, hearing):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        assert 1 <= sent < len(deaf_first), "every command to the deaf node counted as sent"
        assert hub.connected_nodes() == [honest_id]
        assert view.greeting(deaf_id) is None


async def test_a_node_whose_close_cannot_be_sent_is_dropped_after_the_hubs_send_timeout(
    run_hub: RunHub, pki: Pki
) -> None:
    """A node whose buffers are full is revoked by a hub told to wait 0.3 s on a send: its
    close frame cannot be sent. The drop is logged. Before, the close waited the default
    2 s (``SEND_TIMEOUT_S``) and the close timeout; now the hub's 0.3 s and the close
    timeout."""
    deaf_id = new_node_id()
    revoked: set[str] = set()

    def revocations(certificate: PresentedCertificate) -> str | None:
        return "revoked" if certificate.common_name in revoked else None

    with capture_logs() as logs:
        async with (
            run_hub(revocations=revocations, send_timeout_s=0.3) as hub,
            deaf_agent(hub, pki.node(deaf_id), deaf_id),
        ):
            await wait_until(lambda: hub.connected_nodes() == [deaf_id])
            await fill_buffers(hub, deaf_id)
            revoked.add(deaf_id)
            revoking = monotonic()
            assert await hub.enforce_revocations() == 1

            def dropped() -> bool:
                return any(e["event"] == "agent_connection_dropped" for e in logs)

            await wait_until(dropped, what="the drop logged")
            waited_s = monotonic() - revoking
    assert waited_s < 0.3 + CLOSE_TIMEOUT_S + 0.5 < SEND_TIMEOUT_S + CLOSE_TIMEOUT_S
    [line] = [e for e in logs if e["event"] == "agent_connection_dropped"]
    assert (line["node_id"], line["code"]) == (deaf_id, 1008)


async def fill_buffers(hub: AgentHub, node_id: str) -> None:
    """Send ``node_id`` (that reads nothing) commands until one waits on the full buffers;
    cancel that one, leaving them full and no send waiting."""
    for number in range(200):
        sending = asyncio.create_task(hub.send_command(node_id, big_start(number)))
        done, _ = await asyncio.wait({sending}, timeout=0.05)
        if not done:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
            return
    raise AssertionError("200 commands of half a MiB went to a node that reads nothing")


async def test_a_heartbeat_counted_past_any_agents_life_closes_only_that_connection(
    hub: AgentHub, pki: Pki
) -> None:
    """Before, a heartbeat's ``seq`` of any size msgspec reads (a thousand digits) was taken
    and echoed back in the ``heartbeat_ack``. An agent counts from 0 on each connection, so
    one past 2**63 - 1 is a lie: that connection is closed (1002, naming the field), and its
    neighbour is answered as before."""
    liar_id, honest_id = new_node_id(), new_node_id()
    async with dial(hub, pki.node(honest_id)) as honest, dial(hub, pki.node(liar_id)) as liar:
        await greet(honest, honest_id, hello_apart(honest_id))
        await greet(liar, liar_id)
        await liar.send(f'{{"type": "heartbeat", "seq": {2**70}}}', text=True)

        assert await answer(liar) is None
        assert await close_code(liar) == 1002
        assert "$.seq" in (liar.close_reason or "")
        await say(honest, Heartbeat(seq=1))
        assert await hear(honest) == HeartbeatAck(seq=1)
        assert hub.connected_nodes() == [honest_id]
