"""``llmgw-server gateway`` as it runs in production: a process of its own, reading the
routing table and keys from PostgreSQL, in front of a real engine (the simulator).

The routing table is written as the control plane writes it (events appended to the log,
``tests.support.routing``), pointing at the simulator's real port; keys are created and
revoked through ``Operations``, as the admin API does. The database is a throwaway cluster
of this test's own, because the test stops and restarts it under the running gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import pytest_asyncio

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.services.operations import Caller, Operations
from app.store.database import create_engine
from app.store.postgres import PostgresEventStore
from devcluster.errors import DevDatabaseError
from devcluster.postgres import LocalPostgres, find_bindir
from tests.support.databases import migrate_for_tests, runtime_url
from tests.support.gateway_process import gateway_process
from tests.support.ports import free_port
from tests.support.postgres import LocalServer
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SERVER = str(Path(sys.executable).parent / "llmgw-server")
MODEL = "sim"
ALICE = Caller(actor="alice")
REVOKED_WITHIN_S = 1.0
STARTED_WITHIN_S = 20.0
REFRESH_INTERVAL_S = 60.0
"""Long enough that only NOTIFY can bring a revocation within the second."""
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4}


@pytest.fixture
def own_server() -> Iterator[LocalServer]:
    """A cluster of the test's own, so that stopping it disturbs nobody else."""
    try:
        find_bindir()
    except DevDatabaseError as exc:
        pytest.skip(str(exc))
    with LocalPostgres(durable=False) as cluster:
        yield LocalServer(cluster)


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, "--instant", port=free_port()) as simulator:
        simulator.wait_healthy()
        yield simulator


class Database:
    """The test's own database, and the store and operations on it (renewed after a
    restart, as a restarted control plane would be)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url, pool_size=2)
        self.store = PostgresEventStore(self.engine)
        self.operations = Operations(self.store)

    async def reopen(self) -> None:
        await self.engine.dispose()
        self.engine = create_engine(self.url, pool_size=2)
        self.store = PostgresEventStore(self.engine)
        self.operations = Operations(self.store)


@pytest_asyncio.fixture(loop_scope="session")
async def database(own_server: LocalServer) -> AsyncIterator[Database]:
    await own_server.create_database("llmgw")
    url = own_server.url("llmgw")
    await asyncio.to_thread(migrate_for_tests, url)
    database = Database(url)
    yield database
    await database.engine.dispose()


def log_events(log: Path) -> list[str]:
    events = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line).get("event", ""))
    return events


async def test_a_standalone_gateway_drops_revoked_keys_at_once_and_outlives_the_database(
    own_server: LocalServer, database: Database, simulator: SimulatorProcess, tmp_path: Path
) -> None:
    await connect_node(database.store, "gpu-1", "127.0.0.1")
    await declare_model(database.store, MODEL)
    await serve_replica(database.store, MODEL, 1, "gpu-1", simulator.port)
    kept = await database.operations.create_key(ALICE, "kept", [MODEL])
    doomed = await database.operations.create_key(ALICE, "doomed", [MODEL])
    port, log = free_port(), tmp_path / "gateway.log"

    with gateway_process(
        database.url,
        gateway_id="gw-test",
        port=port,
        log=log,
        options=("--refresh-interval", str(REFRESH_INTERVAL_S)),
    ) as gateway:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10.0) as http:

            async def status(key: str) -> int:
                answer = await http.post(
                    "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}
                )
                return answer.status_code

            async def ready() -> int:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/readyz")).status_code
                assert gateway.poll() is None, log.read_text()
                return 0

            async def answers(key: str, expected: int) -> bool:
                return await status(key) == expected

            async def readiness(expected: int) -> bool:
                return await ready() == expected

            await wait_until(
                lambda: readiness(200), within_s=STARTED_WITHIN_S, what="gateway ready"
            )
            sdk = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=doomed.key, max_retries=0)
            reply = await sdk.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            assert reply.choices[0].message.content

            # A revoked key is refused within a second, by NOTIFY alone.
            await database.operations.revoke_key(ALICE, doomed.record.prefix)
            await wait_until(
                lambda: answers(doomed.key, 401),
                within_s=REVOKED_WITHIN_S,
                what="the revoked key refused",
            )
            assert await status(kept.key) == 200

            # PostgreSQL goes away: the gateway serves from its last table and keys.
            await database.engine.dispose()
            await own_server.stop()
            await wait_until(lambda: readiness(503), within_s=5.0, what="readyz stale")
            stale = (await http.get("/readyz")).json()
            assert stale["status"] == "stale", stale
            assert "database unreachable" in stale["reason"], stale
            for _ in range(5):
                assert await status(kept.key) == 200
            assert await status(doomed.key) == 401

            # It comes back: the gateway catches up and a key created now works.
            await own_server.start()
            await database.reopen()
            newcomer = await database.operations.create_key(ALICE, "newcomer", [MODEL])
            await wait_until(lambda: answers(newcomer.key, 200), within_s=10.0, what="the new key")
            assert await ready() == 200

    assert gateway.returncode == 0, log.read_text()
    events = log_events(log)
    assert events.count("database_unreachable") == 1, events
    assert events.count("database_reachable") == 1, events


async def test_a_gateway_whose_metrics_port_is_taken_says_which_listener_cannot_listen(
    database_url: str, tmp_path: Path
) -> None:
    """A gateway has two listeners; "address already in use" alone sends the operator to
    the wrong one. The client port is free here, the metrics port is not."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    metrics_port = taken.getsockname()[1]
    try:
        finished = await asyncio.to_thread(
            subprocess.run,
            [
                *(SERVER, "gateway", "--database-url", runtime_url(database_url)),
                *("--port", str(free_port()), "--metrics-port", str(metrics_port)),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=STARTED_WITHIN_S,
            check=False,
        )
    finally:
        taken.close()

    assert finished.returncode == 1, finished.stdout + finished.stderr
    failed = [
        json.loads(line)
        for line in (finished.stdout + finished.stderr).splitlines()
        if "gateway_failed_to_start" in line
    ]
    assert len(failed) == 1, finished.stdout + finished.stderr
    assert f"metrics listener cannot listen on 127.0.0.1:{metrics_port}" in failed[0]["error"]
