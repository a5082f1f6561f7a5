"""An agent whose report the leader cannot record (its connection to PostgreSQL broke while
appending the hello): the agent is told to reconnect (1013, try again later) with a reason,
the server logs one line and no traceback, and the agent's next hello is recorded as usual,
the leader's fold then equal to a fresh replay of the log.

The leader's store reaches PostgreSQL through a relay (``tests.support.tcp_relay``) that
resets the connection carrying the hello's append once the call is sent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from app import bootstrap
from app.bootstrap import AgentHubConfig, control_plane_engine
from app.services.control_plane import ControlPlaneConfig, Role
from app.services.leader import LeaderElection
from app.store.database import create_engine
from app.store.database_url import parse_database_url
from app.store.postgres import PostgresEventStore
from app.store.projection import all_rows
from app.store.replay import replay
from tests.support.fake_agents import LOOPBACK, gpu, make_pki
from tests.support.tcp_relay import Break, TcpRelay
from tests.support.waiting import wait_until
from wire.messages import PROTOCOL_VERSION, Hello, encode

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-unrecorded"
CLOSED_WITHIN_S = 10.0


async def read_until_closed(websocket: ClientConnection) -> None:
    while True:
        await websocket.recv()


async def fold_equals_a_fresh_replay(database_url: str, store: PostgresEventStore) -> bool:
    engine = create_engine(database_url, pool_size=1)
    try:
        replayed = await replay(engine)
    finally:
        await engine.dispose()
    state = await store.catch_up()
    return state.position == replayed.position and all_rows(state) == all_rows(replayed)


async def test_an_agent_whose_hello_is_not_recorded_reconnects_and_is_recorded_then(
    database_url: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    hello = encode(
        Hello(
            protocol_version=PROTOCOL_VERSION,
            node_id=NODE,
            agent_version="test",
            address=LOOPBACK,
            port_range=(20000, 20099),
            gpus=(gpu(0),),
            shards=(),
        )
    )
    (host, port), *_ = parse_database_url(database_url).hosts
    assert port is not None
    election = LeaderElection(database_url, "server-a", retry_interval_s=0.1, check_interval_s=0.1)
    config = ControlPlaneConfig(
        server_id=election.holder_id, agent_host=LOOPBACK, agent_port=0, reconcile_interval_s=0.2
    )
    async with TcpRelay(host, port) as relay:
        engine = control_plane_engine(relay.in_front_of(database_url))
        store = PostgresEventStore(engine)
        plane = bootstrap.control_plane(
            store, database_url, config, AgentHubConfig(tls=pki.server_context()), election=election
        )
        stop = asyncio.Event()
        running = asyncio.create_task(plane.run(stop))
        try:
            await wait_until(lambda: plane.role is Role.LEADER, what="the control plane leading")
            assert plane.leader is not None
            url = f"wss://{LOOPBACK}:{plane.leader.hub.port}"
            broken = relay.break_after_sending(b"llmgw_append", Break.RESET)
            with capture_logs() as logs:
                async with connect(url, ssl=pki.node(NODE)) as websocket:
                    await websocket.send(hello, text=True)
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(read_until_closed(websocket), CLOSED_WITHIN_S)
            assert broken.is_set()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == CloseCode.TRY_AGAIN_LATER, closed.value.rcvd
            assert "could not record" in closed.value.rcvd.reason
            events = [entry["event"] for entry in logs]
            assert "agent_connection_failed" not in events, logs
            assert events.count("agent_connection_closed_unrecorded") == 1, logs

            async with connect(url, ssl=pki.node(NODE)) as websocket:
                await websocket.send(hello, text=True)

                async def connected_in_the_log() -> bool:
                    node = (await store.catch_up()).nodes.get(NODE)
                    return node is not None and node.connected

                await wait_until(connected_in_the_log, what="the second hello recorded")
            await wait_until(lambda: fold_equals_a_fresh_replay(database_url, store))
        finally:
            stop.set()
            await asyncio.gather(running, return_exceptions=True)
            await election.close()
            await engine.dispose()
