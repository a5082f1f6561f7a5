"""Trust: a node with a valid certificate speaks only for itself, and a revoked certificate
stops working at once. Real processes throughout: the control plane, a standalone gateway,
agents with the engine simulator, and a hand-written WebSocket client holding a real node
certificate, which replays the attack that once sent a client's prompt to a listener the
attacker controlled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.pki.tls import client_ssl_context
from tests.support.cluster import SIMULATOR_COMMAND, Cluster, about, node_of
from tests.support.fleet import LOOPBACK
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until
from wire.messages import (
    PROTOCOL_VERSION,
    GpuReport,
    Heartbeat,
    Hello,
    ShardReport,
    StopShard,
    Welcome,
    decode_from_server,
    encode,
)

pytestmark = pytest.mark.timeout(120)

HONEST = ("gpu-a", "gpu-b")
ROGUE = "gpu-x"
"""A node whose certificate the attacker holds; it runs no real agent."""
MODEL = "slow"
START_DELAY_S = 6.0


class RogueListener:
    """Where the attacker wants the gateway to send prompts; it counts who connects."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RogueListener:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _accept(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()


@contextlib.asynccontextmanager
async def rogue_node(cluster: Cluster, replica_id: str, port: int) -> AsyncIterator[list[str]]:
    """Connect as ROGUE and report ``replica_id`` ready at ``port``; yields the commands the
    control plane sends it, as they arrive."""
    credentials = cluster.pki.node(ROGUE)
    context = client_ssl_context(credentials.ca, credentials.certificate, credentials.key)
    received: list[str] = []
    hello = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=ROGUE,
        agent_version="rogue",
        address=LOOPBACK,
        port_range=(1024, 65535),
        gpus=(
            GpuReport(
                index=0,
                uuid="GPU-rogue",
                name="H100",
                memory_total_mib=81559,
                memory_used_mib=0,
                healthy=True,
            ),
        ),
        shards=(
            ShardReport(
                replica_id=replica_id,
                shard_index=0,
                model=MODEL,
                port=port,
                gpus=(0,),
                pid=4242,
                state="ready",
                started_at=datetime.now(UTC),
            ),
        ),
    )
    async with connect(cluster.servers[0].agent_uri, ssl=context) as websocket:
        await websocket.send(encode(hello), text=True)
        welcome = decode_from_server(await websocket.recv())
        assert isinstance(welcome, Welcome)
        listening = asyncio.create_task(_listen(websocket, received))
        try:
            yield received
        finally:
            listening.cancel()


async def _listen(websocket: ClientConnection, received: list[str]) -> None:
    seq = 0
    with contextlib.suppress(ConnectionClosed):
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    message = decode_from_server(await websocket.recv())
                    if isinstance(message, StopShard):
                        received.append(message.command_id)
            seq += 1
            await websocket.send(encode(Heartbeat(seq=seq)), text=True)


async def test_a_node_cannot_take_over_a_replica_starting_on_another_node(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    for node in HONEST:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(HONEST)
    gateway = await cluster.start_gateway()
    command = SIMULATOR_COMMAND.replace("--instant", f"--instant --start-delay {START_DELAY_S}")
    await cluster.apply_simulated_model(MODEL, replicas=1, command=command)
    key = await cluster.create_key("trust-traffic", [MODEL])
    await cluster.wait_for_event("shard_starting", about(replica_id=f"{MODEL}-1"))
    [replica] = await cluster.replicas(model=MODEL)
    assert replica["phase"] == "starting", replica
    placed_on = node_of(replica)

    async with RogueListener() as rogue, rogue_node(cluster, f"{MODEL}-1", rogue.port) as stops:
        stray = await cluster.wait_for_event("stray_stopped", about(node_id=ROGUE))
        assert stray.get("rule") == f"placed on {placed_on}, reported by {ROGUE}", stray.data
        assert stray.stream == f"node-{ROGUE}"
        await wait_until(lambda: stops == [f"stray-{MODEL}-1-0-4242"], what="the stray stopped")

        [serving] = await cluster.wait_for_serving(MODEL, 1, within_s=30.0)
        assert node_of(serving) == placed_on
        await wait_until(lambda: serves(gateway.url, key, MODEL), what="the gateway routes")
        async with Traffic(gateway.url, key, MODEL, clients=4) as traffic:
            await traffic.wait_for_successes(40)
        traffic.assert_no_failures()
        assert rogue.connections == 0

    adopted = await cluster.events("replica_adopted")
    assert [e for e in adopted if e.get("node_id") == ROGUE] == []


async def test_a_revoked_node_certificate_is_cut_off_and_a_new_one_connects(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_for_leader()
    agent = cluster.start_agent("gpu-a")
    await cluster.wait_for_nodes_connected(["gpu-a"])

    revoked = await cluster.cli(
        "cert", "revoke", "--node", "gpu-a", "--reason", "machine stolen", "--output", "json"
    )
    assert revoked.returncode == 0, revoked.stderr
    revoked_at = datetime.fromisoformat(json.loads(revoked.stdout)["revocation"]["revoked_at"])

    await wait_until(agent.exited, within_s=10.0, what="the agent with the revoked certificate")
    assert agent.process.returncode == 1, agent.log()
    assert "revoked" in agent.log()
    refusal = await cluster.wait_for_event("identity_rejected", about(claimed_node_id="gpu-a"))
    assert "machine stolen" in str(refusal.get("reason")), refusal.data
    assert [n["connected"] for n in await cluster.nodes() if n["id"] == "gpu-a"] == [False]

    listed = await cluster.cli(
        "cert", "list", "--dir", str(cluster.pki.directory), "--output", "json"
    )
    assert listed.returncode == 0, listed.stderr
    [row] = [row for row in json.loads(listed.stdout) if row["name"] == "gpu-a"]
    assert row["state"] == "revoked", row
    assert row["revocation"]["reason"] == "machine stolen", row

    # Certificates carry their times to the second: one issued in the second of the
    # revocation cannot be told apart from one issued before it, and is refused too.
    await wait_until(
        lambda: datetime.now(UTC) >= revoked_at + timedelta(seconds=1),
        what="a second after the revocation",
    )
    cluster.pki.reissue("gpu-a")
    cluster.start_agent("gpu-a")
    await cluster.wait_for_nodes_connected(["gpu-a"])
