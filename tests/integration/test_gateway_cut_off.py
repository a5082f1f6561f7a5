"""A gateway cut off from PostgreSQL while everything else reaches it: a key revoked
meanwhile is served by it from the keys it last read, as docs/gateway.md ("Keys") says,
with its ``/readyz`` at 503 ``stale`` so that a load balancer sends it no client; once the
network mends it reads the keys again and refuses the key at once.

The gateway is a process of its own on the test database, reaching it through a relay the
test cuts (``tests.support.tcp_relay``); the key is revoked through ``Operations`` on a
connection of the test's own, as the admin API of any control plane would."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.services.operations import Caller, Operations
from app.store.database import create_engine
from app.store.database_url import parse_database_url
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.tcp_relay import TcpRelay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = "sim"
ALICE = Caller(actor="alice")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2}
REFRESH_INTERVAL_S = "0.5"
"""A read of the routing table and keys every half second, so that the first one after the
cut starts at once and times out (in 5 s) soon."""
STALE_WITHIN_S = 10.0
REFUSED_WITHIN_S = 5.0
"""Reconnecting and reading the keys again: about 0.1 s measured."""


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, "--instant", port=free_port()) as simulator:
        simulator.wait_healthy()
        yield simulator


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[PostgresEventStore]:
    engine = create_engine(database_url, pool_size=2)
    yield PostgresEventStore(engine)
    await engine.dispose()


async def test_a_gateway_cut_off_serves_a_key_revoked_meanwhile_until_it_reads_the_keys_again(
    database_url: str, store: PostgresEventStore, simulator: SimulatorProcess, tmp_path: Path
) -> None:
    operations = Operations(store)
    await connect_node(store, "gpu-1", "127.0.0.1")
    await declare_model(store, MODEL)
    await serve_replica(store, MODEL, 1, "gpu-1", simulator.port)
    key = await operations.create_key(ALICE, "revoked-while-cut-off", [MODEL])
    (host, port), *_ = parse_database_url(database_url).hosts
    assert port is not None
    gateway_port = free_port()

    async with TcpRelay(host, port) as relay:
        with gateway_process(
            relay.in_front_of(database_url),
            gateway_id="gw-cut-off",
            port=gateway_port,
            log=tmp_path / "gateway.log",
            options=("--refresh-interval", REFRESH_INTERVAL_S),
        ):
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{gateway_port}",
                headers={"authorization": f"Bearer {key.key}"},
                timeout=10.0,
            ) as http:

                async def answers(status: int) -> bool:
                    try:
                        return (
                            await http.post("/v1/chat/completions", json=CHAT)
                        ).status_code == status
                    except httpx.TransportError:
                        return False

                async def ready_as(status: str) -> bool:
                    try:
                        return (await http.get("/readyz")).json().get("status") == status
                    except httpx.TransportError:
                        return False

                await wait_until(lambda: answers(200), within_s=20.0, what="the key served")

                relay.cut()
                await wait_until(
                    lambda: ready_as("stale"), within_s=STALE_WITHIN_S, what="readyz stale"
                )
                await operations.revoke_key(ALICE, key.record.prefix)
                assert await answers(200), "served from the keys read before the cut"
                stale = await http.get("/readyz")
                assert stale.status_code == 503, stale.text

                relay.mend()
                await wait_until(
                    lambda: answers(401), within_s=REFUSED_WITHIN_S, what="the revoked key refused"
                )
                await wait_until(
                    lambda: ready_as("ready"), within_s=REFUSED_WITHIN_S, what="ready again"
                )
