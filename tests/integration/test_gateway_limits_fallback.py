"""When PostgreSQL goes away, a gateway keeps enforcing a key's rpm: with the slices it
holds, then with its local share (the limit over the live gateways, one here), and says so
in ``/readyz``, its ``/metrics`` and its log; when the database is back, limits are shared
again.

The database is a throwaway cluster of this test's own, stopped under the running gateway
(as in test_gateway_process.py). It takes about 15 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.server import StaticSource
from app.services.operations import Caller, Operations
from app.store.database import create_engine
from app.store.postgres import PostgresEventStore
from devcluster.errors import DevDatabaseError
from devcluster.postgres import LocalPostgres, find_bindir
from tests.support.databases import migrate_for_tests, runtime_url
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port
from tests.support.postgres import LocalServer
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SERVER = str(Path(sys.executable).parent / "llmgw-server")
MODEL = "sim"
ALICE = Caller(actor="alice")
RPM = 120
BEFORE = 30
"""Requests admitted while the database answers."""
MOST_HELD = 3
"""What a gateway can hold of a 120-rpm key: slices are 1 % of it (one request), asked for
at half a slice left, plus one on credit."""


@pytest.fixture
def own_server() -> Iterator[LocalServer]:
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


def sample(page: str, name: str) -> float | None:
    for line in page.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_without_the_database_a_gateway_enforces_its_local_share_and_says_so(
    own_server: LocalServer, simulator: SimulatorProcess, tmp_path: Path
) -> None:
    await own_server.create_database("llmgw")
    url = own_server.url("llmgw")
    await asyncio.to_thread(migrate_for_tests, url)
    engine = create_engine(url, pool_size=2)
    store = PostgresEventStore(engine)
    await connect_node(store, "gpu-1", "127.0.0.1")
    await declare_model(store, MODEL)
    await serve_replica(store, MODEL, 1, "gpu-1", simulator.port)
    key = await Operations(store).create_key(ALICE, "limited", [MODEL], rpm=RPM)
    await engine.dispose()
    port, metrics_port, log = free_port(), free_port(), tmp_path / "gateway.log"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    with log.open("wb") as output:
        gateway = subprocess.Popen(  # noqa: ASYNC220 (started once; its output goes to a file)
            [
                *(SERVER, "gateway", "--database-url", runtime_url(url)),
                *("--port", str(port), "--metrics-port", str(metrics_port)),
                *("--gateway-id", "gw-fallback"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"authorization": f"Bearer {key.key}"},
            timeout=10.0,
        ) as http:

            async def readyz(expected: int) -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/readyz")).status_code == expected
                return False

            async def degraded_metric() -> float | None:
                page = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
                return sample(page, "llmgw_gateway_rate_limits_degraded")

            async def send() -> int:
                return (await http.post("/v1/chat/completions", json=body)).status_code

            await wait_until(lambda: readyz(200), within_s=20.0, what="gateway ready")
            assert [await send() for _ in range(BEFORE)] == [200] * BEFORE
            assert await degraded_metric() == 0.0

            await own_server.stop()

            async def says_degraded() -> bool:
                answer = await http.get("/readyz")
                return answer.status_code == 503 and "limits" in answer.json()

            await wait_until(says_degraded, within_s=10.0, what="readyz says limits are local")
            ready = (await http.get("/readyz")).json()
            assert "rate limits are enforced locally" in ready["limits"], ready
            assert "1/1 of its limit" in ready["limits"], ready
            assert await degraded_metric() == 1.0

            # What it held, then the local share: the whole limit, one gateway being live.
            during = [await send() for _ in range(RPM + 20)]
            admitted = during.count(200)
            assert set(during) == {200, 429}, during
            assert RPM <= admitted <= RPM + MOST_HELD, admitted
            assert during[-10:] == [429] * 10, "refused once the share is spent"

            await own_server.start()
            await wait_until(lambda: readyz(200), within_s=20.0, what="ready again")

            async def shared_again() -> bool:
                return await degraded_metric() == 0.0

            await wait_until(shared_again, within_s=10.0, what="limits shared again")
    finally:
        if gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
            try:
                gateway.wait(timeout=10)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait()
        print(f"----- {log} -----\n{log.read_text(errors='replace')[-5000:]}")
    events = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line).get("event", ""))
    assert events.count("rate_limits_degraded") == 1, events
    assert events.count("rate_limits_shared") == 1, events


def test_readyz_says_limits_are_local_while_the_routing_table_is_fresh_and_stays_200() -> None:
    """The database can answer the snapshot's reads and still fail the budget's grants
    (a lock timeout, a privilege missing): the gateway is still ready, only degraded."""
    reason: list[str | None] = [None]
    _, record = new_key(rpm=60)
    with GatewayThread(
        StaticSource(snapshot_of([], [record])), limits_reason=lambda: reason[0]
    ) as gateway:
        ready = httpx.get(f"{gateway.base_url}/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        reason[0] = "rate limits are enforced locally: the database does not answer"
        degraded = httpx.get(f"{gateway.base_url}/readyz")
        assert degraded.status_code == 200
        assert degraded.json() == {"status": "degraded", "limits": reason[0]}
