"""The agent hub end to end: real TLS on 127.0.0.1, real WebSockets, real PostgreSQL.

Agents here are plain WebSocket clients that speak the protocol by hand with the messages
of ``wire.messages``, so each story shows exactly what goes over the wire and what the
log records because of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from time import monotonic

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from app.domain import commands
from app.domain.commands import NodeNotConnected
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    GpuMarkedUnhealthy,
    IdentityRejected,
    NodeConnected,
    NodeRegistered,
    ReplicaPlaced,
    ShardFailed,
    ShardPlacement,
    event_type,
    node_stream,
    replica_stream,
)
from app.domain.state import ClusterState
from app.hub.connection import LIVENESS_TIMEOUT_S
from app.hub.edge import command_to_wire, report_of
from app.hub.hub import AgentHub
from app.hub.session import AgentHello
from app.pki.builders import issue, issue_operator
from app.pki.model import CertificateAuthority, Usage, Validity
from app.services.agent_reports import ReportRecorder
from app.store.interface import NO_STREAM, AppendRequest, NewEvent, StillHolds
from app.store.postgres import PostgresEventStore
from tests.support.hub import (
    DEADLINE_S,
    ENGINE_ADDRESS,
    LOOPBACK,
    Pki,
    RunHub,
    close_code,
    dial,
    event_types,
    greet,
    hear,
    hello,
    hub,
    new_node_id,
    pki,
    run_hub,
    say,
    stream_is,
)
from tests.support.tcp_relay import TcpRelay
from tests.support.waiting import wait_until
from wire.messages import (
    MAX_MESSAGE_BYTES,
    GpuHealthChange,
    Heartbeat,
    HeartbeatAck,
    ShardStatus,
)

__all__ = ["hub", "pki", "run_hub"]  # fixtures, shared with the other stories of the hub

# -- who may connect ---------------------------------------------------------------------


async def test_a_node_with_its_own_certificate_is_registered_and_connected(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    node_id = new_node_id()
    async with dial(hub, pki.node(node_id)) as agent:
        welcome = await greet(agent, node_id)

        assert welcome.server_id == "test-hub"
        await wait_until(
            stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"]),
            what="the node registered and connected",
        )
        node = pg_store.state.nodes[node_id]
        assert node.connected
        assert node.address == ENGINE_ADDRESS
        assert node.labels == {"zone": "a"}
        assert [g.index for g in node.gpus] == [0]
        assert hub.connected_nodes() == [node_id]
        async with engine.connect() as db:
            row = (
                await db.execute(
                    text("SELECT connected, remote_address FROM nodes WHERE id = :id"),
                    {"id": node_id},
                )
            ).one()
        assert row.connected is True
        assert row.remote_address.startswith(f"{LOOPBACK}:")


async def test_every_line_about_a_connection_names_its_node_and_peer(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    with capture_logs(processors=[merge_contextvars]) as logs:
        async with dial(hub, pki.node(node_id)) as agent:
            peer = f"{LOOPBACK}:{agent.local_address[1]}"
            await greet(agent, node_id)
            await wait_until(
                stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"]),
                what="the node registered and connected",
            )
        await wait_until(
            lambda: any(e["event"] == "agent_disconnected" for e in logs),
            what="the hub seeing the agent go",
        )

    about = [e for e in logs if e.get("remote_address") == peer]
    assert [e["event"] for e in about if e["event"] != "fleet_events_recorded"] == [
        "agent_connected",
        "agent_disconnected",
    ]
    assert {e["event"] for e in about} >= {"fleet_events_recorded"}  # the service's lines too
    assert all(e["node_id"] == node_id for e in about)


def bad_certificate(pki: Pki, what: str, node_id: str) -> ssl.SSLContext:
    past = Validity(not_before=pki.now - timedelta(days=10), not_after=pki.now - timedelta(days=1))
    current = Validity.starting(pki.now, 1)

    def node(ca: CertificateAuthority, usage: Usage, validity: Validity) -> ssl.SSLContext:
        return pki.client(
            lambda key: issue(
                ca, key, common_name=node_id, unit="node", usages=(usage,), validity=validity
            )
        )

    match what:
        case "none":
            return pki.anonymous()
        case "another CA":
            return node(pki.stranger, Usage.CLIENT_AUTH, current)
        case "expired":
            return node(pki.ca, Usage.CLIENT_AUTH, past)
        case "no clientAuth":
            return node(pki.ca, Usage.SERVER_AUTH, current)
    raise ValueError(what)


@pytest.mark.parametrize(
    "certificate",
    ["none", "another CA", "expired", "no clientAuth"],
)
async def test_a_bad_client_certificate_never_gets_past_tls(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, certificate: str
) -> None:
    node_id = new_node_id()
    context = bad_certificate(pki, certificate, node_id)

    with pytest.raises((ssl.SSLError, OSError, InvalidHandshake)):
        async with dial(hub, context) as agent:
            await greet(agent, node_id)

    assert await pg_store.read_all() == []
    assert hub.connected_nodes() == []


async def test_an_operator_certificate_is_refused_and_the_attempt_recorded(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    operator = f"ops-{uuid.uuid4().hex[:6]}"
    context = pki.client(lambda key: issue_operator(pki.ca, key, operator, pki.now, 1))

    async with dial(hub, context) as agent:
        assert await close_code(agent) == 1008
        assert "only node certificates" in (agent.close_reason or "")

    await wait_until(stream_is(pg_store, node_stream(operator), ["identity_rejected"]))
    [recorded] = await pg_store.read_stream(node_stream(operator))
    assert recorded.meta.actor == "agent-hub"
    assert isinstance(recorded.event, IdentityRejected)
    assert "OU=operator" in recorded.event.certificate_subject
    assert operator not in pg_store.state.nodes


async def test_a_node_claiming_another_nodes_id_is_refused_and_recorded(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    holder, claimed = new_node_id(), new_node_id()

    async with dial(hub, pki.node(holder)) as agent:
        local_port = agent.local_address[1]
        await say(agent, hello(claimed))
        assert await close_code(agent) == 1008

    await wait_until(stream_is(pg_store, node_stream(claimed), ["identity_rejected"]))
    [recorded] = await pg_store.read_stream(node_stream(claimed))
    assert recorded.event == IdentityRejected(
        claimed_node_id=claimed,
        certificate_subject=f"O=llmgw,OU=node,CN={holder}",
        remote_address=f"{LOOPBACK}:{local_port}",
        reason=f"certificate common name {holder!r} does not match node id {claimed!r}",
    )
    assert claimed not in pg_store.state.nodes
    assert holder not in pg_store.state.nodes
    assert await event_types(pg_store, node_stream(holder)) == []


# -- one bad connection, and the others carry on -----------------------------------------


@pytest.mark.parametrize(
    ("frame", "expected_code"),
    [
        (b"\x00\xff\x13garbage", 1002),
        ("{not json", 1002),
        ('{"type": "dance", "steps": 3}', 1002),
        ('"' + "x" * MAX_MESSAGE_BYTES + '"', 1009),
        ('{"type": "heartbeat", "seq": 0, "x": ' + "[" * 50_000 + "]" * 50_000 + "}", 1002),
    ],
    ids=["binary garbage", "invalid JSON", "unknown type", "oversized", "nested too deep"],
)
async def test_a_bad_frame_closes_that_connection_only(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, frame: str | bytes, expected_code: int
) -> None:
    good_id, bad_id = new_node_id(), new_node_id()
    async with dial(hub, pki.node(good_id)) as good, dial(hub, pki.node(bad_id)) as bad:
        await greet(good, good_id)
        await greet(bad, bad_id)

        # The hub may hang up while an oversized frame is still going out.
        with contextlib.suppress(ConnectionClosed):
            await bad.send(frame)
        assert await close_code(bad) == expected_code

        await say(good, Heartbeat(seq=0))
        assert await hear(good) == HeartbeatAck(seq=0)
        await wait_until(
            stream_is(
                pg_store,
                node_stream(bad_id),
                ["node_registered", "node_connected", "node_disconnected"],
            ),
            what="the bad agent marked disconnected",
        )
        await say(good, Heartbeat(seq=1))
        assert await hear(good) == HeartbeatAck(seq=1)
        assert hub.connected_nodes() == [good_id]
        assert pg_store.state.nodes[good_id].connected


# -- reconnects and liveness -------------------------------------------------------------


async def test_a_second_connection_replaces_a_half_open_first_and_the_node_stays_connected(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """The agent restarted while its old connection is half-open: nothing goes over it any
    more (a relay carries it, and is cut), and the hub has not noticed. The old one answers
    no ping, so once ``LIVENESS_TIMEOUT_S`` is over the new one takes its place (4001)."""
    node_id = new_node_id()
    async with (
        TcpRelay(LOOPBACK, hub.port) as relay,
        connect(
            f"wss://{LOOPBACK}:{relay.port}", ssl=pki.node(node_id), close_timeout=0.1
        ) as first,
        dial(hub, pki.node(node_id)) as second,
    ):
        await greet(first, node_id)
        await wait_until(lambda: hub.connected_nodes() == [node_id])
        relay.cut()
        with capture_logs() as logs:
            hello_at = monotonic()
            await greet(second, node_id)
            await wait_until(
                stream_is(
                    pg_store,
                    node_stream(node_id),
                    ["node_registered", "node_connected", "node_connected"],
                ),
                what="the newer connection recorded",
            )
            replaced_after_s = monotonic() - hello_at

        assert replaced_after_s >= LIVENESS_TIMEOUT_S
        closing = [
            (e["code"], e["node_id"]) for e in logs if e["event"] == "agent_connection_closing"
        ]
        assert closing == [(4001, node_id)]
        # The replaced connection is gone; the newer one still speaks for the node.
        await say(second, Heartbeat(seq=0))
        assert await hear(second) == HeartbeatAck(seq=0)
        assert hub.connected_nodes() == [node_id]
        command = commands.StartShard(
            command_id="c-1",
            replica_id="llama-1",
            shard_index=0,
            model="llama",
            argv=("vllm", "serve"),
            env={},
            gpus=(0,),
            port=20001,
        )
        await hub.send_command(node_id, command)
        assert await hear(second) == command_to_wire(command)

        await wait_until(
            stream_is(
                pg_store,
                node_stream(node_id),
                ["node_registered", "node_connected", "node_connected"],
            )
        )
        last = (await pg_store.read_stream(node_stream(node_id)))[-1].event
        assert isinstance(last, NodeConnected)
        assert last.replaced_previous
        assert pg_store.state.nodes[node_id].connected


async def test_a_command_for_a_node_without_a_connection_is_refused(hub: AgentHub) -> None:
    stop = commands.StopShard(command_id="c-9", replica_id="llama-9", shard_index=0, grace_s=5)
    with pytest.raises(NodeNotConnected, match="has no live agent connection"):
        await hub.send_command(new_node_id(), stop)


async def test_an_agent_that_stops_heartbeating_is_marked_disconnected(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    async with (
        run_hub(heartbeat_interval_s=0.1, heartbeat_timeout_s=0.5) as hub,
        dial(hub, pki.node(node_id)) as agent,
    ):
        await greet(agent, node_id)

        assert await close_code(agent) == 4002
        assert (agent.close_reason or "").startswith("no heartbeat for")
        await wait_until(
            stream_is(
                pg_store,
                node_stream(node_id),
                ["node_registered", "node_connected", "node_disconnected"],
            )
        )
        assert not pg_store.state.nodes[node_id].connected
        assert hub.connected_nodes() == []


# -- what agents report ------------------------------------------------------------------


async def test_a_gpu_that_fails_and_recovers_is_recorded_both_times(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    stream = node_stream(node_id)
    failing = GpuHealthChange(index=0, uuid="GPU-0", healthy=False, reason="Xid 79", xid=79)
    recovered = GpuHealthChange(index=0, uuid="GPU-0", healthy=True)
    async with dial(hub, pki.node(node_id)) as agent:
        await greet(agent, node_id)
        await wait_until(stream_is(pg_store, stream, ["node_registered", "node_connected"]))

        await say(agent, Heartbeat(seq=0, gpu_changes=(failing,)))
        assert await hear(agent) == HeartbeatAck(seq=0)
        await wait_until(
            stream_is(
                pg_store, stream, ["node_registered", "node_connected", "gpu_marked_unhealthy"]
            )
        )
        assert not pg_store.state.nodes[node_id].gpus[0].healthy

        await say(agent, Heartbeat(seq=1, gpu_changes=(recovered,)))
        assert await hear(agent) == HeartbeatAck(seq=1)
        await wait_until(
            stream_is(
                pg_store,
                stream,
                ["node_registered", "node_connected", "gpu_marked_unhealthy", "gpu_recovered"],
            )
        )

    marked = (await pg_store.read_stream(stream))[2].event
    assert marked == GpuMarkedUnhealthy(
        node_id=node_id, gpu_index=0, gpu_uuid="GPU-0", reason="Xid 79", xid=79
    )
    assert pg_store.state.nodes[node_id].gpus[0].healthy


async def test_a_failed_shard_is_recorded_with_its_log_tail(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    replica_id = f"llama-{uuid.uuid4().hex[:6]}"
    placed = ReplicaPlaced(
        replica_id=replica_id,
        model="llama",
        number=1,
        shards=(ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20001),),
    )
    await pg_store.append(replica_stream(replica_id), 0, [NewEvent(placed)], Meta(actor="test"))
    failed = ShardStatus(
        replica_id=replica_id,
        shard_index=0,
        state="failed",
        port=20001,
        error="CUDA out of memory",
        exit_code=1,
        log_tail=("loading weights", "torch.OutOfMemoryError"),
    )
    async with dial(hub, pki.node(node_id)) as agent:
        await greet(agent, node_id)
        await say(agent, failed)

        await wait_until(
            stream_is(pg_store, replica_stream(replica_id), ["replica_placed", "shard_failed"])
        )

    [_, recorded] = await pg_store.read_stream(replica_stream(replica_id))
    assert recorded.meta.actor == f"agent:{node_id}"
    assert recorded.event == ShardFailed(
        replica_id=replica_id,
        shard_index=0,
        node_id=node_id,
        error="CUDA out of memory",
        exit_code=1,
        log_tail=("loading weights", "torch.OutOfMemoryError"),
    )


# -- racing another writer ---------------------------------------------------------------


class RivalWritesFirst:
    """The event store, with another control plane appending just before our first append
    (after we have decided), as happens when two writers race for one stream."""

    def __init__(self, store: PostgresEventStore, rival: Callable[[], Awaitable[None]]) -> None:
        self._store = store
        self._rival: Callable[[], Awaitable[None]] | None = rival

    @property
    def state(self) -> ClusterState:
        return self._store.state

    async def append(
        self, stream: str, expected_version: int | None, events: Sequence[NewEvent], meta: Meta
    ) -> list[Recorded]:
        return await self.append_many([AppendRequest(stream, expected_version, events)], meta)

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        meta: Meta,
        *,
        still_holds: StillHolds | None = None,
    ) -> list[Recorded]:
        rival, self._rival = self._rival, None
        if rival is not None:
            await rival()
        return await self._store.append_many(requests, meta, still_holds=still_holds)

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]:
        return await self._store.read_stream(stream, after_version)

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]:
        return await self._store.read_all(after_position, limit)

    async def stream_version(self, stream: str) -> int:
        return await self._store.stream_version(stream)

    def known_version(self, stream: str) -> int:
        return self._store.known_version(stream)

    async def last_position(self) -> int:
        return await self._store.last_position()

    async def catch_up(self) -> ClusterState:
        return await self._store.catch_up()


async def test_a_hello_that_loses_the_race_to_register_is_decided_again(
    pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    node_id = new_node_id()

    async def rival_registers() -> None:
        registration = NodeRegistered(node_id=node_id, address="127.0.0.9")
        await PostgresEventStore(engine).append(
            node_stream(node_id), NO_STREAM, [NewEvent(registration)], Meta(actor="rival")
        )

    recorder = ReportRecorder(RivalWritesFirst(pg_store, rival_registers))
    observation = AgentHello(node_id=node_id, hello=hello(node_id), remote_address="127.0.0.7:1")

    await recorder.handle(report_of(observation))

    recorded = await pg_store.read_stream(node_stream(node_id))
    assert [(r.meta.actor, event_type(r.event)) for r in recorded] == [
        ("rival", "node_registered"),
        (f"agent:{node_id}", "node_connected"),
    ]
    assert pg_store.state.nodes[node_id].connected


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_the_hubs_listener_answers_health_checks_and_records_nothing(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, path: str
) -> None:
    async with httpx.AsyncClient(verify=pki.node(new_node_id()), timeout=DEADLINE_S) as client:
        answer = await client.get(f"https://{LOOPBACK}:{hub.port}{path}")

    assert answer.status_code == 200
    assert answer.json() == {"status": "ok", "role": "leader"}
    assert await pg_store.read_all() == []
    assert hub.connected_nodes() == []


async def test_a_connection_counts_as_opening_until_its_handshakes_finish(
    hub: AgentHub, pki: Pki
) -> None:
    """Agents still arriving keep the adoption grace open: a peer whose TLS handshake has
    not finished counts; an agent past its handshakes, or a health check answered, not."""
    assert hub.connections_opening() == 0
    _reader, writer = await asyncio.open_connection(LOOPBACK, hub.port)  # TCP, no TLS yet
    try:
        await wait_until(lambda: hub.connections_opening() == 1, what="the connection counted")
        node_id = new_node_id()
        async with dial(hub, pki.node(node_id)) as agent:
            await greet(agent, node_id)
            assert hub.connections_opening() == 1, "only the one still in its handshake"
        async with httpx.AsyncClient(verify=pki.node(new_node_id()), timeout=DEADLINE_S) as c:
            assert (await c.get(f"https://{LOOPBACK}:{hub.port}/healthz")).status_code == 200
        await wait_until(lambda: hub.connections_opening() == 1, what="the health check gone")
    finally:
        writer.close()
        await writer.wait_closed()
