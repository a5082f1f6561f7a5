"""What a node with a valid certificate may still not do, tried over real mTLS WebSockets
against a real PostgreSQL: advertise an address it cannot vouch for, report an inventory no
machine has or numbers no table holds, flood the hub, keep using a revoked certificate."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from app.domain.egress import EngineNetworks
from app.domain.envelope import Meta
from app.domain.events import (
    GpuMarkedUnhealthy,
    ModelDeclared,
    NodeRefused,
    ReplicaPlaced,
    ShardPlacement,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.domain.revocations import PresentedCertificate
from app.hub.budget import MessageBudget
from app.hub.hub import AgentHub
from app.pki.builders import issue_node
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.hub import (
    ENGINE_ADDRESS,
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
from wire.messages import GpuHealthChange, Heartbeat, HeartbeatAck, ShardState, ShardStatus

__all__ = ["hub", "pki", "run_hub"]  # fixtures

METADATA_SERVICE = "169.254.169.254"  # a deliberately foreign address: it must be refused


async def flood(agent: ClientConnection, count: int) -> int:
    """Heartbeats as fast as the socket takes them, until the hub closes the connection;
    how many the hub acknowledged (it acknowledges each heartbeat it accepts)."""
    acknowledged = 0

    async def read_acknowledgements() -> None:  # so the hub's close frame is not stuck
        nonlocal acknowledged
        with contextlib.suppress(ConnectionClosed):
            while True:
                await agent.recv()
                acknowledged += 1

    reader = asyncio.create_task(read_acknowledgements())
    try:
        with contextlib.suppress(ConnectionClosed):
            for seq in range(count):
                await say(agent, Heartbeat(seq=seq))
                if seq % 10 == 0:
                    await asyncio.sleep(0)
        await reader
    finally:
        reader.cancel()
    return acknowledged


async def refusals(store: PostgresEventStore, node_id: str) -> list[NodeRefused]:
    return [
        r.event
        for r in await store.read_stream(node_stream(node_id))
        if isinstance(r.event, NodeRefused)
    ]


@pytest.mark.parametrize(
    "address", [METADATA_SERVICE, "127.0.0.9", "metadata.google.internal", "localhost"]
)
async def test_an_address_the_certificate_does_not_name_is_refused_at_hello(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, address: str
) -> None:
    """Before, a node could point the gateway at any address: 169.254.169.254 was accepted."""
    node_id = new_node_id()
    async with dial(hub, pki.node(node_id)) as agent:
        await say(agent, msgspec.structs.replace(hello(node_id), address=address))
        assert await close_code(agent) == 1008
        assert "advertised address" in (agent.close_reason or "")

    await wait_until(stream_is(pg_store, node_stream(node_id), ["node_refused"]))
    [refusal] = await refusals(pg_store, node_id)
    assert f"advertised address {address!r} is neither named" in refusal.reason
    assert "(IP:127.0.0.7)" not in refusal.reason  # the names are listed plainly
    assert "127.0.0.7" in refusal.reason
    assert LOOPBACK in refusal.reason
    assert node_id not in pg_store.state.nodes
    assert hub.connected_nodes() == []


async def test_the_address_a_connection_comes_from_needs_no_naming(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    async with dial(hub, pki.node(node_id, ips=())) as agent:
        await say(agent, msgspec.structs.replace(hello(node_id), address=LOOPBACK))
        await wait_until(
            stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"])
        )
    assert pg_store.state.nodes[node_id].address == LOOPBACK


async def test_a_host_name_the_certificate_names_is_accepted_where_the_networks_list_it(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    context = pki.client(
        lambda key: issue_node(pki.ca, key, node_id, pki.now, 1, hosts=["gpu-7.example.test"])
    )
    networks = EngineNetworks.parse("127.0.0.0/8,gpu-7.example.test")
    async with run_hub(engine_networks=networks) as hub, dial(hub, context) as agent:
        await say(agent, msgspec.structs.replace(hello(node_id), address="GPU-7.example.test"))
        await wait_until(
            stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"])
        )
    assert pg_store.state.nodes[node_id].address == "GPU-7.example.test"


async def test_a_vouched_address_the_gateway_may_not_contact_is_refused_at_hello(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """The certificate names 127.0.0.7, but the engine networks are 127.0.0.1 alone: the
    gateway would never route there, so the node hears why at once."""
    node_id = new_node_id()
    networks = EngineNetworks.parse("127.0.0.1/32")
    async with run_hub(engine_networks=networks) as hub, dial(hub, pki.node(node_id)) as agent:
        await say(agent, hello(node_id))
        assert await close_code(agent) == 1008
    await wait_until(stream_is(pg_store, node_stream(node_id), ["node_refused"]))
    [refusal] = await refusals(pg_store, node_id)
    assert "outside the engine networks the gateway may contact" in refusal.reason


IMPOSSIBLE = {
    "two GPUs with one index": {"gpus": (gpu(0), gpu(0))},
    "two GPUs with one UUID": {"gpus": (gpu(0), msgspec.structs.replace(gpu(1), uuid="GPU-0"))},
    "more memory used than there is": {
        "gpus": (msgspec.structs.replace(gpu(0), memory_used_mib=90000),)
    },
    "a GPU of 2 TiB": {"gpus": (msgspec.structs.replace(gpu(0), memory_total_mib=2**21),)},
    "a hundred GPUs": {"gpus": tuple(gpu(i) for i in range(100))},
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
async def test_an_inventory_no_machine_has_is_refused_and_not_folded_into_nodes(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, case: str
) -> None:
    node_id = new_node_id()
    async with dial(hub, pki.node(node_id)) as agent:
        await say(agent, msgspec.structs.replace(hello(node_id), **IMPOSSIBLE[case]))
        assert await close_code(agent) == 1002

    await wait_until(stream_is(pg_store, node_stream(node_id), ["node_refused"]))
    [refusal] = await refusals(pg_store, node_id)
    assert refusal.reason.startswith(("the hello lists", "GPU 0 reports"))
    assert node_id not in pg_store.state.nodes


async def place_on(store: PostgresEventStore, node_id: str) -> str:
    """A replica of a new model placed on ``node_id``, as the reconciler records it; its id."""
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


NO_TABLE_HOLDS: dict[str, tuple[dict[str, Any], str]] = {
    "pid 2**63": ({"state": "starting", "pid": 2**63}, "$.pid"),
    "pid -5": ({"state": "starting", "pid": -5}, "$.pid"),
    "pid 0": ({"state": "starting", "pid": 0}, "$.pid"),
    "exit code 10**12": ({"state": "failed", "exit_code": 10**12}, "$.exit_code"),
}


@pytest.mark.parametrize("lie", sorted(NO_TABLE_HOLDS))
async def test_a_number_out_of_range_closes_that_connection_and_records_nothing(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore, lie: str
) -> None:
    """Before, a pid of 2**63 for a shard placed on the node failed the append (the shards
    table's pid is 32-bit): the hub logged a traceback and closed with 1011 "internal
    error", and a pid of -5 or 0 was recorded as it came. Now the status is malformed: 1002
    naming the field, one log line, nothing recorded, the neighbour untouched."""
    change, path = NO_TABLE_HOLDS[lie]
    liar_id, honest_id = new_node_id(), new_node_id()
    with capture_logs() as logs:
        async with dial(hub, pki.node(honest_id)) as honest, dial(hub, pki.node(liar_id)) as liar:
            await greet(honest, honest_id, hello_apart(honest_id))
            await greet(liar, liar_id)
            await wait_until(
                stream_is(pg_store, node_stream(liar_id), ["node_registered", "node_connected"])
            )
            replica_id = await place_on(pg_store, liar_id)
            await say(liar, ShardStatus(replica_id=replica_id, shard_index=0, port=20001, **change))

            assert await close_code(liar) == 1002
            assert path in (liar.close_reason or "")
            await say(honest, Heartbeat(seq=1))
            assert await hear(honest) == HeartbeatAck(seq=1)
            assert hub.connected_nodes() == [honest_id]
    assert await event_types(pg_store, replica_stream(replica_id)) == ["replica_placed"]
    closing = [e for e in logs if e.get("node_id") == liar_id and e["log_level"] != "info"]
    assert [(e["event"], e.get("code")) for e in closing] == [("agent_connection_closing", 1002)]


async def test_a_shard_flipped_between_two_phases_closes_that_connection(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """Before, a node could flip a shard placed on it between starting and ready for ever,
    and every status wrote an event to the log: 100 statuses, 100 events. Now a status no
    engine's life explains (ready back to starting, no start_shard sent) closes that
    connection with 1002 naming the shard and both phases, one log line; what came before
    it is all that was recorded, and the neighbour is untouched."""
    liar_id, honest_id = new_node_id(), new_node_id()
    with capture_logs() as logs:
        async with dial(hub, pki.node(honest_id)) as honest, dial(hub, pki.node(liar_id)) as liar:
            await greet(honest, honest_id, hello_apart(honest_id))
            await greet(liar, liar_id)
            await wait_until(
                stream_is(pg_store, node_stream(liar_id), ["node_registered", "node_connected"])
            )
            replica_id = await place_on(pg_store, liar_id)
            with contextlib.suppress(ConnectionClosed):
                for number in range(100):
                    state: ShardState = "starting" if number % 2 == 0 else "ready"
                    await say(
                        liar,
                        ShardStatus(replica_id=replica_id, shard_index=0, state=state, port=20001),
                    )

            assert await close_code(liar) == 1002
            assert liar.close_reason == (
                f"ready -> starting for shard {replica_id}/0: no start_shard explains it"
            )
            await say(honest, Heartbeat(seq=1))
            assert await hear(honest) == HeartbeatAck(seq=1)
            assert hub.connected_nodes() == [honest_id]
            await wait_until(
                stream_is(
                    pg_store,
                    node_stream(liar_id),
                    ["node_registered", "node_connected", "node_disconnected"],
                ),
                what="the liar's connection closed and recorded",
            )
    assert await event_types(pg_store, replica_stream(replica_id)) == [
        "replica_placed",
        "shard_starting",
        "shard_ready",
    ]
    closing = [e for e in logs if e.get("node_id") == liar_id and e["log_level"] != "info"]
    assert [(e["event"], e.get("code")) for e in closing] == [("agent_connection_closing", 1002)]


async def test_health_changes_of_gpus_the_hello_did_not_list_are_ignored_with_one_line(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """Before, a heartbeat could name any GPU: a change at an index the hello listed but
    with another UUID was recorded under that UUID, and every index named took a place in
    the flap guard's memory for good. Now a change counts only for a GPU the hello listed,
    index and UUID alike; the others are dropped, with one log line per connection."""
    node_id = new_node_id()
    stream = node_stream(node_id)
    invented = GpuHealthChange(index=7, uuid="GPU-7", healthy=False, reason="Xid 79", xid=79)
    foreign = GpuHealthChange(index=0, uuid="GPU-stolen", healthy=False, reason="Xid 48")
    true = GpuHealthChange(index=0, uuid="GPU-0", healthy=False, reason="Xid 79", xid=79)
    with capture_logs(processors=[merge_contextvars]) as logs:
        async with dial(hub, pki.node(node_id)) as agent:
            await greet(agent, node_id)
            await wait_until(stream_is(pg_store, stream, ["node_registered", "node_connected"]))
            for seq, change in enumerate((invented, foreign, invented, true)):
                await say(agent, Heartbeat(seq=seq, gpu_changes=(change,)))
                assert await hear(agent) == HeartbeatAck(seq=seq)
            # One node's reports are recorded in order: the true change comes after the others.
            await wait_until(
                stream_is(
                    pg_store, stream, ["node_registered", "node_connected", "gpu_marked_unhealthy"]
                ),
                what="the listed GPU's change recorded, and nothing of the others",
            )
            assert hub.connected_nodes() == [node_id]

    marked = (await pg_store.read_stream(stream))[2].event
    assert marked == GpuMarkedUnhealthy(
        node_id=node_id, gpu_index=0, gpu_uuid="GPU-0", reason="Xid 79", xid=79
    )
    ignored = [e for e in logs if e["event"] == "agent_gpu_changes_ignored"]
    assert [(e["node_id"], e["gpus"]) for e in ignored] == [(node_id, ["7 (GPU-7)"])]


async def test_a_flood_of_heartbeats_closes_that_connection_with_one_recorded_event(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    budget = MessageBudget(messages_per_s=20, message_burst=50)
    honest_id, flooder_id = new_node_id(), new_node_id()
    async with (
        run_hub(budget=budget) as hub,
        dial(hub, pki.node(honest_id)) as honest,
        dial(hub, pki.node(flooder_id)) as flooder,
    ):
        await greet(honest, honest_id)
        await greet(flooder, flooder_id)
        started = time.monotonic()
        accepted = await flood(flooder, 10_000)
        elapsed = time.monotonic() - started
        assert await close_code(flooder) == 1008
        assert "over the message budget" in (flooder.close_reason or "")
        await wait_until(
            stream_is(
                pg_store,
                node_stream(flooder_id),
                ["node_registered", "node_connected", "node_disconnected", "node_refused"],
            ),
            what="the flooder cut off, and recorded once",
        )
        await say(honest, Heartbeat(seq=1))  # the honest node was never disturbed
        assert hub.connected_nodes() == [honest_id]

        async with dial(hub, pki.node(flooder_id)) as again:  # and it is cooling down
            assert await close_code(again) == 1008
            assert "cut off for sending too much" in (again.close_reason or "")
        assert hub.connected_nodes() == [honest_id]
    # The burst, and what the rate earned while the flood lasted: not one heartbeat more.
    assert accepted <= budget.message_burst + budget.messages_per_s * elapsed
    recorded = await event_types(pg_store, node_stream(flooder_id))
    assert recorded.count("node_connected") == 1  # the refused reconnection said no hello


async def test_a_node_reconnecting_in_a_tight_loop_is_told_to_come_back_later(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """Before, every connection of a node cost a hello, an adoption comparison and two
    events, however often it came. Now a node may connect 10 times at once and 10 times a
    minute after that: one more is closed with 4004 before its hello, records nothing, and
    its refusals are logged once a minute, not once each."""
    node_id, other_id = new_node_id(), new_node_id()
    context = pki.node(node_id)
    admitted, refused = 0, 0
    with capture_logs() as logs:
        started = time.monotonic()
        while refused < 3 and admitted < 30:
            async with dial(hub, context) as agent:
                try:
                    await greet(agent, node_id)
                except ConnectionClosed:
                    assert await close_code(agent) == 4004
                    assert "too often" in (agent.close_reason or "")
                    refused += 1
                else:
                    assert refused == 0, "a refusal, then an admission within seconds"
                    admitted += 1
        elapsed = time.monotonic() - started
        async with dial(hub, pki.node(other_id)) as other:  # another node is not held back
            await greet(other, other_id)
    assert 10 <= admitted <= 10 + elapsed / 6  # the burst, and a token every 6 s after it
    assert refused == 3

    async def every_admission_recorded() -> bool:
        return (await event_types(pg_store, node_stream(node_id))).count(
            "node_connected"
        ) == admitted

    await wait_until(every_admission_recorded, what="the admitted connections recorded")
    assert "node_refused" not in await event_types(pg_store, node_stream(node_id))
    too_often = [e for e in logs if e["event"] == "agent_connection_too_often"]
    assert [e["node_id"] for e in too_often] == [node_id]


async def test_repeated_refusals_of_one_certificate_are_recorded_once_a_minute(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    context = pki.node(node_id)
    for _ in range(5):
        async with dial(hub, context) as agent:
            await say(agent, msgspec.structs.replace(hello(node_id), address=METADATA_SERVICE))
            assert await close_code(agent) == 1008
    # A node's observations are recorded in the order they came: once its good hello is in
    # the log, every refusal before it that was going to be recorded is too.
    async with dial(hub, context) as agent:
        await greet(agent, node_id)
        await wait_until(
            stream_is(
                pg_store,
                node_stream(node_id),
                ["node_refused", "node_registered", "node_connected"],
            ),
            what="one refusal recorded of five, then the good hello",
        )
    [refusal] = await refusals(pg_store, node_id)
    assert refusal.suppressed == 0  # the first of its minute: nothing was left out before it


async def test_a_revoked_certificate_is_refused_at_the_handshake_and_its_connection_closed(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """The leader wires the hub to the log's revocations; here a dict stands for the log."""
    node_id = new_node_id()
    revoked: dict[str, str] = {}

    def check(certificate: PresentedCertificate) -> str | None:
        return revoked.get(certificate.serial)

    context = pki.node(node_id)
    async with run_hub(revocations=check) as hub, dial(hub, context) as agent:
        await greet(agent, node_id)
        await wait_until(
            stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"])
        )
        serial = pg_store.state.nodes[node_id].certificate_serial
        assert serial
        assert await hub.enforce_revocations() == 0  # nothing revoked yet: nothing closed

        revoked[serial] = f"certificate {serial} was revoked: stolen"
        assert await hub.enforce_revocations() == 1
        assert await close_code(agent) == 1008
        assert "revoked" in (agent.close_reason or "")

        async with dial(hub, context) as again:
            assert await close_code(again) == 1008
        assert hub.connected_nodes() == []
    await wait_until(
        stream_is(
            pg_store,
            node_stream(node_id),
            ["node_registered", "node_connected", "node_disconnected", "identity_rejected"],
        ),
        what="the revoked connection closed, and the refusals recorded once",
    )


async def test_a_connection_revoked_before_its_hello_is_closed_and_never_welcomed(
    run_hub: RunHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    """A connection that passed the revocation check but has not said hello yet is no
    node's connection yet; it is still cut off when its certificate is revoked. Before, it
    was left open, and the hello it sent next was welcomed: a stolen certificate kept one
    connection waiting before its hello and outlived its revocation."""
    node_id = new_node_id()
    revoked: dict[str, str] = {}

    def check(certificate: PresentedCertificate) -> str | None:
        return revoked.get(certificate.serial) or revoked.get(certificate.common_name)

    async with run_hub(revocations=check) as hub, dial(hub, pki.node(node_id)) as agent:
        await wait_until(lambda: hub.connections_opening() == 0, what="the connection served")
        revoked[node_id] = f"the certificates of node {node_id} were revoked: stolen"
        assert await hub.enforce_revocations() == 1
        with contextlib.suppress(ConnectionClosed):
            await say(agent, hello(node_id))
        assert await close_code(agent) == 1008
        assert "revoked" in (agent.close_reason or "")
        assert hub.connected_nodes() == []
    await wait_until(
        stream_is(pg_store, node_stream(node_id), ["identity_rejected"]),
        what="the refusal recorded under the certificate's node",
    )


async def test_a_connection_is_closed_when_its_certificate_expires(
    run_hub: RunHub, pki: Pki
) -> None:
    """TLS checks a certificate's dates at the handshake only; a WebSocket that outlives
    them is closed then (1008, saying so). Before, it stayed connected as long as it kept
    talking, months after the certificate's end."""
    node_id = new_node_id()
    # Issued a day ago for a day: it ends a few seconds from now (whole seconds).
    issued = datetime.now(UTC) - timedelta(days=1) + timedelta(seconds=4)
    context = pki.client(
        lambda key: issue_node(
            pki.ca, key, node_id, issued, 1, ips=[ipaddress.ip_address(ENGINE_ADDRESS)]
        )
    )
    async with run_hub() as hub, dial(hub, context) as agent:
        await greet(agent, node_id)
        assert await close_code(agent) == 1008
        assert "certificate expired" in (agent.close_reason or "")
        assert hub.connected_nodes() == []
