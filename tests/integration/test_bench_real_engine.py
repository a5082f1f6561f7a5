"""`llmgw-cli bench --url` against a real inference engine: llama.cpp's ``llama-server``
serving a real 270M-parameter model on the CPU (``tests.support.real_engine``; skipped only
where the ``llamacpp`` extra is not installed), and ``--apply`` through the admin API.

CPU inference on a shared machine is slow and uneven, so the SLO is loose and the climb
short: what is tested is that bench completes against the real engine, reads the engine's
real ``/metrics`` (its queue; it has no KV-cache gauge), and, since the loose SLO still
holds at --max-concurrency, knows the capacity only as a lower bound and has ``--apply``
record nothing. The capacities bench finds, and the recommendations it records, are
tested against the simulator (``test_bench.py``).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from agent.simulator.launcher import free_port
from app.domain.events import model_stream
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import LOOPBACK, bearer_client, serving_admin
from tests.support.bench_cli import bench
from tests.support.real_engine import RealEngine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "gemma"
OPERATOR = "alice"
TOKEN = secrets.token_hex(16)
SLOTS = 2
OUTPUT_TOKENS = 4
READY_WITHIN_S = 60.0
"""The model loads in a few seconds alone; two cores shared with other test runs can make
that many times longer."""
LEVELS = (
    *("--max-concurrency", str(SLOTS), "--warmup", "500ms", "--requests", "6"),
    *("--sample-interval", "100ms", "--input-tokens", "16"),
    *("--output-tokens", str(OUTPUT_TOKENS)),
)
"""Two levels (1 and 2, as many as the engine has slots) of six requests each: some ten
seconds of CPU inference."""
LOOSE_SLO = ("--slo", "e2e_p99=30s")
"""Four tokens take well under a second on an idle core; thirty leaves room for a loaded
machine without letting a hung engine pass."""


@pytest_asyncio.fixture(loop_scope="session")
async def llama_server(real_engine: RealEngine, tmp_path: Path) -> AsyncIterator[str]:
    """``llama-server`` serving the real model as ``MODEL``, started the way a model spec's
    command starts it; its base URL once it answers ``/health``."""
    port = free_port()
    command = real_engine.command(slots=SLOTS, context=1024).format(
        host=LOOPBACK, port=port, model=MODEL
    )
    log = tmp_path / "llama-server.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *shlex.split(command), stdout=output, stderr=asyncio.subprocess.STDOUT
        )
    url = f"http://{LOOPBACK}:{port}"
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:

            async def healthy() -> bool:
                assert process.returncode is None, log.read_text(errors="replace")[-2000:]
                try:
                    return (await http.get(f"{url}/health")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(healthy, within_s=READY_WITHIN_S, every_s=0.1, what="llama-server")
        yield url
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def test_bench_measures_a_real_engine_and_applies_nothing_from_a_level_below_its_limit(
    llama_server: str, real_engine: RealEngine, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    async with serving_admin(pg_store, tokens={TOKEN: OPERATOR}) as admin_url:
        async with bearer_client(admin_url, TOKEN) as admin:
            spec = {"engine": "llamacpp", "command": real_engine.command(), "replicas": 1}
            declared = await admin.put(f"/admin/v1/models/{MODEL}", json=spec)
            assert declared.status_code == 200, declared.text
        declared_events = len(await pg_store.read_stream(model_stream(MODEL)))

        result = await bench(
            tmp_path,
            *("--url", llama_server, *LOOSE_SLO, *LEVELS, "--apply"),
            environment={"LLMGW_ADMIN_URL": admin_url, "LLMGW_ADMIN_TOKEN": TOKEN},
        )

    report = result.report
    assert report.target.model == MODEL
    assert report.target.ignore_eos is True
    assert [level.concurrency for level in report.levels] == [1, SLOTS], result.stdout
    assert report.capacity == SLOTS, result.stdout
    assert report.capacity_is_lower_bound
    assert re.search(rf"^capacity: at least {SLOTS} concurrent", result.stdout, re.M)
    # Every request answered in full: llama.cpp closes a connection after each streamed
    # answer, and bench must not count the next request sent on it as failed.
    assert [level.errors for level in report.levels] == [0, 0], result.stdout
    assert all(level.mean_output_tokens == OUTPUT_TOKENS for level in report.levels)
    assert (result.report_dir / "bench.png").read_bytes().startswith(b"\x89PNG")

    at_capacity = report.level(report.capacity)
    assert at_capacity is not None
    # Its queue (requests_deferred) was read; it has no KV-cache gauge.
    assert at_capacity.waiting is not None
    assert at_capacity.kv_cache_usage is None

    # Nothing queued with as many clients as slots: that is no limit to admit by.
    assert result.code == 1, result.stderr
    assert report.recommendation is None
    assert f"not reached within --max-concurrency {SLOTS}" in result.stderr
    assert report.applied is None
    assert len(await pg_store.read_stream(model_stream(MODEL))) == declared_events
