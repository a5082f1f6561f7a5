"""What gateways measure of each replica's requests, from real gateway processes in front of
real engines (the simulator), through PostgreSQL to the admin API and ``llmgw-cli``.

Two ``llmgw-server gateway`` processes follow one database. Behind them: a fast replica, a
slow one (10 ms per prompt token, so its first token comes 400 ms late), one that answers
503 to everything (``--never-ready``) and one that crashes after two answers (the requests
after that find its port closed). Clients send requests through both gateways, and one client
walks away from a slow stream. Then the merged figures say which replica is slow and
which fails, the cancel is no error, and the two gateways' counts add up.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.domain.traffic import RESOLUTION, TrafficFigures
from app.services.operations import Caller, Operations
from app.store.database import connection
from app.store.gateway_reports import TrafficReports
from app.store.postgres import PostgresEventStore
from tests.support.gateway_process import FAST_SCRAPE, gateway_process
from tests.support.operator_cli import Operator, live_admin_api
from tests.support.ports import free_port
from tests.support.routing import connect_node, declare_model, serve_replica
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

ALICE = Caller(actor="alice")
STARTED_WITHIN_S = 20.0
PROMPT_WORDS = 40
FAST = ("--prefill-ms-per-token", "0", "--decode-base-ms", "2", "--decode-per-seq-ms", "0")
SLOW = ("--prefill-ms-per-token", "10", "--decode-base-ms", "20", "--decode-per-seq-ms", "0")
"""400 ms before the first token of a 40-word prompt; 20 ms a token after it."""


@contextlib.contextmanager
def simulators() -> Iterator[dict[str, SimulatorProcess]]:
    with (
        start_simulator("--model", "fast", *FAST) as fast,
        start_simulator("--model", "slow", *SLOW) as slow,
        start_simulator("--model", "broken", "--never-ready") as broken,
        start_simulator("--model", "flaky", *FAST, "--crash-after-requests", "2") as flaky,
    ):
        for healthy in (fast, slow, flaky):
            healthy.wait_healthy()
        yield {"fast": fast, "slow": slow, "broken": broken, "flaky": flaky}


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(pg_store: PostgresEventStore) -> AsyncIterator[str]:
    """Four models of one replica each, serving on simulators: an API key for all four."""
    with simulators() as engines:
        for number, (model, engine) in enumerate(engines.items(), start=1):
            node = f"gpu-{number}"
            await connect_node(pg_store, node, "127.0.0.1")
            await declare_model(pg_store, model)
            await serve_replica(pg_store, model, 1, node, engine.port)
        created = await Operations(pg_store).create_key(ALICE, "traffic", list(engines))
        yield created.key


def chat(model: str, *, stream: bool, max_tokens: int = 8) -> dict[str, object]:
    # A unique first word: the simulator's prefix cache would skip a repeated prompt's prefill.
    words = " ".join([uuid.uuid4().hex, *["word"] * (PROMPT_WORDS - 1)])
    return {
        "model": model,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def send(http: httpx.AsyncClient, model: str, *, stream: bool) -> int:
    answer = await http.post("/v1/chat/completions", json=chat(model, stream=stream))
    return answer.status_code


async def walk_away_mid_stream(http: httpx.AsyncClient) -> None:
    """Read the first chunk of a slow stream, then close the connection."""
    body = chat("slow", stream=True, max_tokens=200)
    async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        async for _ in answer.aiter_bytes():
            break


async def figures(reader: TrafficReports, replica_id: str) -> TrafficFigures:
    found = await reader.replica_traffic(replica_id)
    assert found is not None, f"no gateway reports traffic of {replica_id}"
    return found


async def test_gateways_measure_latency_and_errors_per_replica_and_their_reports_merge(
    cluster: str, database_url: str, engine: AsyncEngine, pg_store: PostgresEventStore,
    tmp_path: Path,
) -> None:  # fmt: skip
    key = cluster
    reader = TrafficReports(engine)
    ports = {"gw-a": free_port(), "gw-b": free_port()}
    headers = {"authorization": f"Bearer {key}"}
    with (
        gateway_process(
            database_url,
            gateway_id="gw-a",
            port=ports["gw-a"],
            log=tmp_path / "a.log",
            options=FAST_SCRAPE,
        ),
        gateway_process(
            database_url,
            gateway_id="gw-b",
            port=ports["gw-b"],
            log=tmp_path / "b.log",
            options=FAST_SCRAPE,
        ),
    ):
        clients = {
            gateway: httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30.0
            )
            for gateway, port in ports.items()
        }
        a, b = clients["gw-a"], clients["gw-b"]
        try:
            for http in (a, b):

                async def routes(http: httpx.AsyncClient = http) -> bool:
                    with contextlib.suppress(httpx.TransportError):
                        return await send(http, "fast", stream=False) == 200
                    return False

                await wait_until(routes, within_s=STARTED_WITHIN_S, what="the gateway routes")

            # gw-a: fast and slow streams, 503s from the broken engine, and the flaky one's
            # two answers before its crash, then four refused connections.
            for _ in range(6):
                assert await send(a, "fast", stream=True) == 200
                assert await send(a, "slow", stream=True) == 200
            assert [await send(a, "broken", stream=False) for _ in range(3)] == [503] * 3
            flaky = [await send(a, "flaky", stream=False) for _ in range(6)]
            assert flaky[:2] == [200, 200], flaky
            assert all(status >= 500 for status in flaky[2:]), flaky
            # gw-b: more fast streams, and a client that walks away from a slow one.
            for _ in range(4):
                assert await send(b, "fast", stream=True) == 200
            await walk_away_mid_stream(b)

            async def all_reported() -> bool:
                fast = await reader.replica_traffic("fast-1")
                slow = await reader.replica_traffic("slow-1")
                return (
                    fast is not None
                    and fast.requests == 2 + 6 + 4  # the two first ones, and the streams
                    and slow is not None
                    and slow.cancelled == 1
                )

            await wait_until(all_reported, within_s=10.0, what="both gateways' reports")

            fast = await figures(reader, "fast-1")
            slow = await figures(reader, "slow-1")
            broken = await figures(reader, "broken-1")
            flaky_figures = await figures(reader, "flaky-1")

            assert (fast.gateways, fast.window_s) == (2, 60.0)
            assert (fast.errors, fast.error_rate, fast.ttft_samples) == (0, 0.0, 10)
            assert (fast.tpot_samples, fast.latency_samples) == (10, 12)
            assert fast.ttft_p95_ms is not None
            assert slow.ttft_p95_ms is not None
            # 40 prompt tokens at 10 ms each before the slow one's first token.
            assert slow.ttft_p95_ms >= 400 * (1 - RESOLUTION)
            assert slow.ttft_p95_ms > fast.ttft_p95_ms
            assert slow.tpot_p95_ms is not None
            assert fast.tpot_p95_ms is not None
            assert slow.tpot_p95_ms > fast.tpot_p95_ms

            # The client that walked away: cancelled, no error, its first chunk measured.
            assert (slow.requests, slow.errors, slow.cancelled) == (6, 0, 1)
            assert (slow.ttft_samples, slow.tpot_samples) == (7, 6)

            assert (broken.requests, broken.errors, broken.error_rate) == (3, 3, 1.0)
            assert (broken.ttft_p95_ms, broken.latency_p95_ms) == (None, None)
            assert (flaky_figures.requests, flaky_figures.errors) == (6, 4)
            assert flaky_figures.error_rate == pytest.approx(4 / 6)

            # The admin API and the CLI say the same.
            async with live_admin_api(pg_store) as url:
                operator = Operator(home=tmp_path, admin_url=url)
                shown = (await operator.run("replica", "slow-1", "--output", "json")).json()
                traffic = shown["traffic"]
                assert (traffic["requests"], traffic["errors"], traffic["cancelled"]) == (6, 0, 1)
                assert traffic["abandoned"] == 0, "its client left after the first chunk"
                assert traffic["gateways"] == 2
                assert traffic["ttft_p95_ms"] >= 400 * (1 - RESOLUTION)
                table = await operator.run("replica", "flaky-1")
                assert table.code == 0, table.stderr
                section = table.stdout[table.stdout.index("traffic (") :]
                assert section.startswith("traffic (last 60 s, 2 gateways):\n"), section
                assert "  requests:    6\n  failed:      4 (66.7 %)\n" in section
                assert max(len(line) for line in section.splitlines()) <= 80
        finally:
            for http in clients.values():
                await http.aclose()

    # Both gateways stopped and removed their reports: nothing is known now.
    assert await reader.replica_traffic("fast-1") is None
    async with live_admin_api(pg_store) as url:
        operator = Operator(home=tmp_path, admin_url=url)
        assert (await operator.run("replica", "fast-1", "--output", "json")).json()[
            "traffic"
        ] is None
        table = await operator.run("replica", "fast-1")
        assert "traffic: no gateway reports in the last 5 s" in table.stdout


async def test_a_malformed_report_is_skipped_and_the_others_still_count(
    engine: AsyncEngine,
) -> None:
    """A gateway's row is its writer's word: one that lies about its figures costs only
    itself."""
    rows = [
        ("good", '{"window_s": 60, "replicas": {"r-1": {"requests": 3, "errors": 1}}}'),
        ("lies", '{"window_s": 60, "replicas": {"r-1": {"requests": 1, "errors": 9}}}'),
        ("junk", '{"window_s": "soon", "replicas": {"r-1": {"requests": 5}}}'),
        ("huge", '{"window_s": 60, "replicas": {"r-1": {"ttft": {"9999": 1}}}}'),
        ("array", '{"window_s": 60, "replicas": [1, 2, 3]}'),
        ("other", '{"window_s": 30, "replicas": {"r-2": {"requests": 2}}}'),
    ]
    async with connection(engine) as db:
        for gateway_id, traffic in rows:
            await db.execute(
                "INSERT INTO gateway_reports (gateway_id, in_flight, traffic) "
                "VALUES ($1, '{}'::jsonb, $2::jsonb)",
                gateway_id,
                traffic,
            )
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, traffic, reported_at) "
            "VALUES ('stale', '{}'::jsonb, $1::jsonb, now() - interval '1 minute')",
            '{"window_s": 60, "replicas": {"r-1": {"requests": 100}}}',
        )
    found = await TrafficReports(engine).replica_traffic("r-1")

    assert found is not None
    # good, and array and other (which name no r-1); not the stale one.
    assert (found.gateways, found.requests, found.errors, found.window_s) == (3, 3, 1, 60.0)
