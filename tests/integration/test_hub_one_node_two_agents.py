"""Two live agents with one node's certificate (a cloned machine, a copied state directory):
the hub keeps the connection it has, which still answers, and refuses the other's with 4005
and a reason that says what to do. Before, each hello replaced the other's connection (4001)
and listed only its own engines, so the other's replicas looked gone and were placed again.

Real TLS on 127.0.0.1, real WebSockets, real PostgreSQL; the agents speak the protocol by
hand (``tests.support.hub``)."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection

from app.domain.events import node_stream
from app.hub.hub import AgentHub
from app.store.postgres import PostgresEventStore
from tests.support.hub import (
    DEADLINE_S,
    LOOPBACK,
    Pki,
    dial,
    event_types,
    greet,
    hear,
    hub,
    new_node_id,
    pki,
    run_hub,
    say,
    stream_is,
)
from tests.support.waiting import wait_until
from wire.messages import Heartbeat, HeartbeatAck

__all__ = ["hub", "pki", "run_hub"]  # fixtures

TRIES = 3


async def the_first_closed(*agents: ClientConnection) -> ClientConnection:
    """Which of ``agents`` the hub closes first (each closing handshake over)."""
    waits = {asyncio.ensure_future(agent.wait_closed()): agent for agent in agents}
    done, pending = await asyncio.wait(
        waits, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED
    )
    for waiting in pending:
        waiting.cancel()
    assert done, f"none closed within {DEADLINE_S}s"
    return waits[done.pop()]


async def test_a_second_live_agent_with_the_node_certificate_is_refused_and_the_first_stays(
    hub: AgentHub, pki: Pki, pg_store: PostgresEventStore
) -> None:
    node_id = new_node_id()
    async with dial(hub, pki.node(node_id)) as first:
        await greet(first, node_id)
        await wait_until(
            stream_is(pg_store, node_stream(node_id), ["node_registered", "node_connected"])
        )
        live_address = f"{LOOPBACK}:{first.local_address[1]}"

        with capture_logs() as logs:
            for _ in range(TRIES):
                async with dial(hub, pki.node(node_id), source="127.0.0.2") as second:
                    await greet(second, node_id)
                    closed = await the_first_closed(first, second)
                    assert (closed is second, closed.close_code) == (True, 4005)
                    reason = second.close_reason or ""

        assert f"connected from {live_address}" in reason
        assert f"two agents run with node {node_id}'s certificate; stop one" in reason
        # The first keeps its connection and its session.
        await say(first, Heartbeat(seq=0))
        assert await hear(first) == HeartbeatAck(seq=0)
        assert hub.connected_nodes() == [node_id]
        assert hub.connected_elsewhere() == TRIES  # llmgw_agent_hellos_connected_elsewhere
        assert await event_types(pg_store, node_stream(node_id)) == [
            "node_registered",
            "node_connected",
        ]
        warned = [e for e in logs if e["event"] == "agent_connected_elsewhere"]
        assert [(e["node_id"], e["live_remote_address"]) for e in warned] == [
            (node_id, live_address)
        ], "one line a minute, however many tries"
        assert not [e for e in logs if e["event"] == "agent_connected"]
