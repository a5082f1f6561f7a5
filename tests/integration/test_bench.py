"""`llmgw-cli bench` as an operator runs it: the installed console script against real
``llmgw-sim-engine`` processes whose capacity model says what the answer must be, and,
for ``--replica`` and ``--apply``, against a real cluster (server, agent, PostgreSQL).

The simulator is set up so that the KV cache holds four unique requests (24 blocks of
16 tokens; a request of 64 prompt and 8 output tokens needs 5) while 16 could run at once.
A decode step takes 30 ms whatever the batch. So unique prompts run four at a time and
queue beyond that, and byte-identical prompts share their four prompt blocks and all 16
run: prefix caching raises the capacity, as it does on real hardware.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import httpx
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web

from agent.simulator.config import CapacityConfig
from agent.simulator.launcher import SimulatorProcess, simulator_command, start_simulator
from agent.simulator.prediction import predict_steady_state
from app.gateway.snapshot import read_snapshot
from app.store.database import driver_url
from cli.bench.report import BenchReport
from cli.bench.total_failure import MIN_FAILURES
from tests.support.bench_cli import CLI_TIMEOUT_S, bench, llmgw_cli
from tests.support.cluster import (
    ADMIN_TOKEN,
    CLI,
    Cluster,
    ClusterPki,
    add_cluster_logs_to_failed_reports,
    issue_pki,
)
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

CAPACITY = CapacityConfig(
    max_num_seqs=16,
    block_size=16,
    num_blocks=24,
    prefill_ms_per_token=0.0,
    decode_base_ms=30.0,
    decode_per_seq_ms=0.0,
)
INPUT_TOKENS = 64
OUTPUT_TOKENS = 8
EOS_AFTER = 3
"""The simulated model would end every answer after 3 tokens; bench asks it not to."""
TTFT_LIMIT_S = 0.31
"""Between the TTFT predicted at concurrency 8 (270 ms: one answer's wait, 240 ms, and a
step) and at 9 (330 ms on average; the unlucky ninth waits two answers)."""
SIMULATOR_FLAGS = (
    *("--max-num-seqs", str(CAPACITY.max_num_seqs)),
    *("--block-size", str(CAPACITY.block_size)),
    *("--num-blocks", str(CAPACITY.num_blocks)),
    *("--prefill-ms-per-token", "0"),
    *("--decode-base-ms", str(CAPACITY.decode_base_ms)),
    *("--decode-per-seq-ms", "0"),
    *("--eos-after", str(EOS_AFTER)),
)
SHORT_LEVELS = (
    *("--warmup", "600ms", "--duration", "1500ms", "--sample-interval", "50ms"),
    *("--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS)),
)
CAPACITY_8_THEN_BROKEN_9 = (*("--start-concurrency", "8", "--max-concurrency", "9", *SHORT_LEVELS),)
"""Two levels: 8, which meets ``TTFT_LIMIT_S``, and 9, which breaks it, so 8 is the capacity
and what the engine showed there its limits (a climb that stops at --max-concurrency within
the SLO recommends nothing)."""
REFUSAL = "The model `sim-model` does not exist."
QUICK_LEVELS = (
    *("--warmup", "100ms", "--requests", "8", "--sample-interval", "20ms"),
    *("--input-tokens", "24", "--output-tokens", "4"),
)


@contextmanager
def running(*flags: str) -> Iterator[SimulatorProcess]:
    with start_simulator(*flags, port=free_port()) as simulator:
        simulator.wait_healthy()
        yield simulator


@pytest.fixture
def simulated() -> Iterator[SimulatorProcess]:
    """The engine described at the top of this module."""
    with running(*SIMULATOR_FLAGS) as simulator:
        yield simulator


@pytest.fixture
def quick_engine() -> Iterator[SimulatorProcess]:
    with running("--decode-base-ms", "2", "--decode-per-seq-ms", "0") as simulator:
        yield simulator


def predicted_capacity(limit_s: float, up_to: int, *, cached_prompt_tokens: int = 0) -> int:
    """The highest concurrency whose predicted TTFT is within ``limit_s``."""
    meets = [
        concurrency
        for concurrency in range(1, up_to + 1)
        if predict_steady_state(
            CAPACITY,
            concurrency=concurrency,
            prompt_tokens=INPUT_TOKENS,
            output_tokens=OUTPUT_TOKENS,
            cached_prompt_tokens=cached_prompt_tokens,
        ).time_to_first_token_s
        <= limit_s
    ]
    return max(meets, default=0)


def prefix_cache_hits(simulator: SimulatorProcess) -> float:
    text = httpx.get(f"{simulator.base_url}/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("vllm:prefix_cache_hits_total{")]
    return float(line.rsplit(" ", 1)[1])


# -- the chart, an extra ------------------------------------------------------------------

HIDE_MATPLOTLIB = """\
import sys


class _Uninstalled:
    \"\"\"Imports of matplotlib fail as they do where the bench extra is not installed.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
"""


def without_matplotlib(directory: Path) -> dict[str, str]:
    """The environment of an ``llmgw-cli`` installed without the ``bench`` extra."""
    (directory / "sitecustomize.py").write_text(HIDE_MATPLOTLIB)
    return {"PYTHONPATH": str(directory)}


async def test_with_the_bench_extra_the_report_comes_with_its_chart(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    result = await bench(
        tmp_path,
        *("--url", quick_engine.base_url, "--slo", "e2e_p99=10s", "--max-concurrency", "2"),
        *QUICK_LEVELS,
    )

    assert result.code == 0, result.stderr
    assert (result.report_dir / "bench.png").read_bytes().startswith(b"\x89PNG")
    assert f"chart: {result.report_dir / 'bench.png'}" in result.stderr
    assert "matplotlib" not in result.stderr


async def test_without_the_bench_extra_the_report_is_written_and_one_line_says_how_to_chart(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    hidden = tmp_path / "site"
    hidden.mkdir()

    result = await bench(
        tmp_path,
        *("--url", quick_engine.base_url, "--slo", "e2e_p99=10s", "--max-concurrency", "2"),
        *QUICK_LEVELS,
        environment=without_matplotlib(hidden),
    )

    assert result.code == 0, result.stderr
    assert [level.concurrency for level in result.report.levels] == [1, 2]
    assert not (result.report_dir / "bench.png").exists()
    [line] = [line for line in result.stderr.splitlines() if "matplotlib" in line]
    assert line == (
        f"report: {result.report_dir / 'bench.json'}; no chart: matplotlib is not installed; "
        "`pip install 'llmgw[bench]'` adds it to draw bench.png next time"
    )
    assert "capacity:" in result.stdout


# -- capacity --------------------------------------------------------------------------


async def test_the_capacity_is_the_one_the_capacity_model_predicts_for_the_slo(
    simulated: SimulatorProcess, tmp_path: Path
) -> None:
    expected = predicted_capacity(TTFT_LIMIT_S, up_to=12)
    assert expected == 8  # four run, four wait one answer's time; a ninth waits two

    result = await bench(
        tmp_path,
        *("--url", simulated.openai_base_url, "--slo", "ttft_p95=310ms"),
        *("--max-concurrency", "12", "--precision", "0", *SHORT_LEVELS),
    )

    assert result.code == 0, result.stderr
    report = result.report
    assert report.stop_reason == "slo_broken"
    assert abs(report.capacity - expected) <= report.resolution == 1, result.stdout
    assert f"capacity: {report.capacity} concurrent requests" in result.stdout
    assert all(level.mean_output_tokens == OUTPUT_TOKENS for level in report.levels)
    assert all(level.prefix_cache_hit_rate == 0 for level in report.levels)
    assert report.target.ignore_eos is True
    assert (result.report_dir / "bench.png").read_bytes().startswith(b"\x89PNG")


async def test_the_recommendation_lies_within_what_the_engine_showed_at_capacity(
    simulated: SimulatorProcess, tmp_path: Path
) -> None:
    result = await bench(
        tmp_path,
        *("--url", simulated.base_url, "--slo", "ttft_p95=310ms"),
        *CAPACITY_8_THEN_BROKEN_9,
    )

    assert result.code == 0, result.stderr
    report = result.report
    at_capacity = report.level(report.capacity)
    recommendation = report.recommendation
    assert at_capacity is not None, result.stdout
    assert recommendation is not None, report.recommendation_note
    waiting, kv = at_capacity.waiting, at_capacity.kv_cache_usage
    assert waiting is not None
    assert kv is not None
    assert waiting.min <= recommendation.target_waiting <= waiting.max
    assert kv.min <= recommendation.kv_ceiling <= kv.max
    assert recommendation.target_waiting >= 3  # four requests queue behind the four running
    assert recommendation.weight == pytest.approx(at_capacity.output_tokens_per_s / 100, rel=0.01)


async def test_an_engine_without_a_kv_gauge_is_benched_by_its_queue_alone(
    tmp_path: Path,
) -> None:
    """As llama.cpp's server (the simulator under its profile): requests_deferred is the
    queue, there is no KV-cache gauge, and the recommendation sets no KV ceiling."""
    with running(*SIMULATOR_FLAGS, "--profile", "llamacpp") as simulator:
        result = await bench(
            tmp_path,
            *("--url", simulator.base_url, "--slo", "ttft_p95=310ms"),
            *CAPACITY_8_THEN_BROKEN_9,
        )

    assert result.code == 0, result.stderr
    report = result.report
    at_capacity = report.level(report.capacity)
    recommendation = report.recommendation
    assert at_capacity is not None, result.stdout
    assert recommendation is not None, report.recommendation_note
    assert at_capacity.kv_cache_usage is None
    assert at_capacity.waiting is not None
    assert at_capacity.waiting.min <= recommendation.target_waiting <= at_capacity.waiting.max
    assert recommendation.target_waiting >= 3  # four requests queue behind the four running
    assert recommendation.kv_ceiling == 1.0


async def test_a_shared_prefix_is_answered_from_the_cache_and_raises_the_capacity(
    simulated: SimulatorProcess, tmp_path: Path
) -> None:
    unique_capacity = predicted_capacity(TTFT_LIMIT_S, up_to=16)
    hits_before = prefix_cache_hits(simulated)

    result = await bench(
        tmp_path,
        *("--url", simulated.base_url, "--slo", "ttft_p95=310ms", "--shared-prefix"),
        *("--max-concurrency", "16", *SHORT_LEVELS),
    )

    assert result.code == 0, result.stderr
    report = result.report
    assert report.capacity > unique_capacity, result.stdout
    assert report.capacity == 16
    assert report.stop_reason == "ceiling"
    assert all((level.prefix_cache_hit_rate or 0) > 0.8 for level in report.levels)
    assert prefix_cache_hits(simulated) > hits_before
    assert report.workload.prefix_cache_reset == "/reset_prefix_cache"


# -- what is sent ----------------------------------------------------------------------


class RecordingProxy:
    """Passes every request through to the engine, streaming, and keeps the bodies of the
    completion requests."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bodies: list[dict[str, Any]] = []
        self.refuse_ignore_eos = False
        """Answer 400 to ``ignore_eos``, as OpenAI's own API does to fields it does not know."""
        self.close_after_stream = False
        """Close the connection after every streamed answer while offering keep-alive, as
        llama.cpp's server does."""
        self.closed_after_stream = 0
        self.refuse_after: int | None = None
        """Answer 400 to every completion request after this many, as an engine does whose
        model went away half way."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path.endswith("/completions"):
            self.bodies.append(json.loads(body))
            if self.refuse_ignore_eos and "ignore_eos" in self.bodies[-1]:
                message = "Unrecognized request argument supplied: ignore_eos"
                return web.json_response({"error": {"message": message}}, status=400)
            if self.refuse_after is not None and len(self.bodies) > self.refuse_after:
                return web.json_response({"error": {"message": REFUSAL}}, status=400)
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                f"{self.upstream}{request.path_qs}",
                data=body,
                headers={"content-type": request.content_type},
            ) as upstream,
        ):
            response = web.StreamResponse(
                status=upstream.status,
                headers={"content-type": upstream.headers.get("content-type", "text/plain")},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            streamed = upstream.content_type == "text/event-stream"
            if self.close_after_stream and streamed and request.transport is not None:
                request.transport.close()
                self.closed_after_stream += 1
            return response

    def prompts(self) -> list[str]:
        """What bench sent to measure, without its first request (the engine probe); the
        second, the check of the run's shape, is one of the run's prompts."""
        return [str(body["prompt"]) for body in self.bodies[1:]]

    def count(self, text: str) -> int:
        return sum(1 for body in self.bodies if text in json.dumps(body))


@pytest_asyncio.fixture(loop_scope="session")
async def proxy(quick_engine: SimulatorProcess) -> AsyncIterator[tuple[str, RecordingProxy]]:
    recorder = RecordingProxy(quick_engine.base_url)
    application = web.Application()
    application.router.add_route("*", "/{path:.*}", recorder.handle)
    runner = web.AppRunner(application)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", recorder
    finally:
        await runner.cleanup()


async def test_default_prompts_differ_from_their_first_bytes_as_sent(
    proxy: tuple[str, RecordingProxy], tmp_path: Path
) -> None:
    url, recorder = proxy

    result = await bench(
        tmp_path,
        *("--url", url, "--slo", "e2e_p99=10s", "--max-concurrency", "4", *QUICK_LEVELS),
    )

    assert result.code == 0, result.stderr
    prompts = recorder.prompts()
    assert len(prompts) >= 3 * 8
    assert all(a[:16] != b[:16] for a, b in itertools.combinations(prompts, 2))
    assert all(len(prompt.split(" ")) == 24 for prompt in prompts)
    assert all(body.get("ignore_eos") is True for body in recorder.bodies)
    assert {body["max_tokens"] for body in recorder.bodies[1:]} == {4}


async def test_shared_prefix_prompts_are_byte_identical_as_sent(
    proxy: tuple[str, RecordingProxy], tmp_path: Path
) -> None:
    url, recorder = proxy

    result = await bench(
        tmp_path,
        *("--url", url, "--slo", "e2e_p99=10s", "--max-concurrency", "4", *QUICK_LEVELS),
        *("--shared-prefix", "--output", "json"),
    )

    assert result.code == 0, result.stderr
    assert msgspec.json.decode(result.stdout, type=BenchReport) == result.report
    prompts = recorder.prompts()
    assert len(prompts) >= 3 * 8
    assert len(set(prompts)) == 1
    assert len(prompts[0].split(" ")) == 24


async def test_an_engine_that_refuses_ignore_eos_is_benched_without_it(
    proxy: tuple[str, RecordingProxy], tmp_path: Path
) -> None:
    url, recorder = proxy
    recorder.refuse_ignore_eos = True

    result = await bench(
        tmp_path,
        *("--url", url, "--slo", "e2e_p99=10s", "--max-concurrency", "2", *QUICK_LEVELS),
    )

    assert result.code == 0, result.stderr
    report = result.report
    assert report.target.ignore_eos is False
    assert any("the engine refused ignore_eos" in note for note in report.notes)
    assert "note: the engine refused ignore_eos" in result.stdout
    assert recorder.count("ignore_eos") == 1  # the first request only
    assert len(recorder.bodies) > 2 * 8


async def test_a_connection_the_engine_closes_after_each_stream_fails_no_request(
    proxy: tuple[str, RecordingProxy], tmp_path: Path
) -> None:
    url, recorder = proxy
    recorder.close_after_stream = True

    result = await bench(
        tmp_path,
        *("--url", url, "--slo", "e2e_p99=10s", "--max-concurrency", "2", *QUICK_LEVELS),
    )

    assert result.code == 0, result.stderr
    assert [level.errors for level in result.report.levels] == [0, 0], result.stdout
    assert recorder.closed_after_stream >= 2 * 8


# -- the plan, progress and where the report goes --------------------------------------

LEVEL_LINE = re.compile(
    r"level (?P<level>\d+) of (?P<bound>at most \d+|\d+), (?P<elapsed>[\d.]+s|\d+m\d\ds) "
    r"elapsed(, at most ~(?P<left>[\d.]+s|\d+m\d\ds) left)?: "
    r"concurrency +(?P<concurrency>\d+): (met|broke) the SLO  "
)


class HoldingProxy(RecordingProxy):
    """Holds the first request bench sends until ``release`` is set, so a test can see
    what bench printed before any request was answered."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.first_request = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.first_request.is_set():
            self.first_request.set()
            await self.release.wait()
        return await super().handle(request)


@pytest_asyncio.fixture(loop_scope="session")
async def holding_proxy(quick_engine: SimulatorProcess) -> AsyncIterator[tuple[str, HoldingProxy]]:
    recorder = HoldingProxy(quick_engine.base_url)
    application = web.Application()
    application.router.add_route("*", "/{path:.*}", recorder.handle)
    runner = web.AppRunner(application)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", recorder
    finally:
        recorder.release.set()
        await runner.cleanup()


async def test_the_plan_and_its_longest_time_are_printed_before_the_first_request(
    holding_proxy: tuple[str, HoldingProxy], tmp_path: Path
) -> None:
    url, proxy = holding_proxy
    report_dir = tmp_path / "report"
    process = await asyncio.create_subprocess_exec(
        CLI,
        *("bench", "--url", url, "--slo", "e2e_p99=10s", "--max-concurrency", "4"),
        *("--warmup", "100ms", "--duration", "500ms", "--sample-interval", "50ms"),
        *("--input-tokens", "24", "--output-tokens", "4", "--output", "json"),
        *("--report-dir", str(report_dir)),
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        await asyncio.wait_for(proxy.first_request.wait(), CLI_TIMEOUT_S)
        # bench waits for the answer to its first request: what it printed came before.
        planned = [
            (await asyncio.wait_for(process.stderr.readline(), 30)).decode() for _ in range(2)
        ]
        proxy.release.set()
        stdout, rest = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert process.returncode == 0, rest
    assert planned == [
        "bench plan: concurrency 1, 2, 4, doubling until a level breaks the SLO, then "
        "bisecting to within 5% (never closer than one)\n",
        "bench plan: at most 4 levels of 0.1s warm-up + 0.5s measure: at most 2.4s, plus the "
        "engine checks and each level's wait for its last answers\n",
    ]
    report = msgspec.json.decode(stdout, type=BenchReport)  # stdout is the report alone
    assert [level.concurrency for level in report.levels] == [1, 2, 4]


async def test_off_a_terminal_each_level_says_which_of_how_many_and_the_time_left(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    result = await bench(
        tmp_path,
        *("--url", quick_engine.base_url, "--slo", "e2e_p99=10s", "--max-concurrency", "4"),
        *QUICK_LEVELS,
    )

    assert result.code == 0, result.stderr
    lines = [m for line in result.stderr.splitlines() if (m := LEVEL_LINE.match(line))]
    assert [(m["level"], m["bound"], m["concurrency"]) for m in lines] == [
        ("1", "at most 4", "1"),  # 4 breaking would bisect to 3
        ("2", "at most 4", "2"),
        ("3", "3", "4"),  # the ceiling met the SLO: the last level
    ]
    # Levels that measure a request count take a time known once one has run.
    assert [m["left"] is not None for m in lines] == [True, True, False]
    assert len(result.report.levels) == 3


async def test_quick_measures_few_short_levels(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    result = await bench(
        tmp_path,
        *("--url", quick_engine.base_url, "--slo", "e2e_p99=10s", "--quick"),
        *("--input-tokens", "24", "--output-tokens", "4"),
    )

    assert result.code == 0, result.stderr
    assert (
        "bench plan: at most 8 levels of 1s warm-up + 3s measure: at most 32s, plus"
        in result.stderr
    )
    report = result.report
    assert (report.workload.warmup_s, report.workload.duration_s) == (1.0, 3.0)
    assert [level.concurrency for level in report.levels] == [1, 2, 4, 8, 16]
    assert report.stop_reason == "ceiling"


async def test_flags_given_with_quick_win_over_its_settings(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    result = await bench(
        tmp_path,
        *("--url", quick_engine.base_url, "--slo", "e2e_p99=10s", "--quick"),
        *("--max-concurrency", "2", *QUICK_LEVELS),
    )

    assert result.code == 0, result.stderr
    report = result.report
    assert [level.concurrency for level in report.levels] == [1, 2]
    assert (report.workload.warmup_s, report.workload.max_requests) == (0.1, 8)


@pytest.mark.parametrize(
    ("state_home", "reports_under"),
    [
        ("{tmp}/state", "state/llmgw/bench"),
        (None, "home/.local/state/llmgw/bench"),
        ("relative/state", "home/.local/state/llmgw/bench"),  # the XDG spec: ignored
    ],
)
async def test_by_default_the_report_goes_to_the_state_directory_not_the_working_one(
    quick_engine: SimulatorProcess, tmp_path: Path, state_home: str | None, reports_under: str
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    environment = {} if state_home is None else {"XDG_STATE_HOME": state_home.format(tmp=tmp_path)}

    code, _, stderr = await llmgw_cli(
        home,
        *("bench", "--url", quick_engine.base_url, "--slo", "e2e_p99=10s"),
        *("--max-concurrency", "1", *QUICK_LEVELS),
        environment=environment,
        cwd=work,
    )

    assert code == 0, stderr
    assert list(work.iterdir()) == []
    [directory] = (tmp_path / reports_under).iterdir()
    assert re.fullmatch(r"sim-model-\d{8}T\d{6}Z", directory.name), directory.name
    assert f"report: {directory / 'bench.json'}, chart: {directory / 'bench.png'}" in stderr
    report = msgspec.json.decode((directory / "bench.json").read_bytes(), type=BenchReport)
    assert [level.concurrency for level in report.levels] == [1]


async def test_report_dir_is_where_the_report_goes_relative_to_the_working_directory(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()

    code, _, stderr = await llmgw_cli(
        home,
        *("bench", "--url", quick_engine.base_url, "--slo", "e2e_p99=10s"),
        *("--max-concurrency", "1", *QUICK_LEVELS, "--report-dir", "runs/first"),
        environment={"XDG_STATE_HOME": str(tmp_path / "state")},
        cwd=work,
    )

    assert code == 0, stderr
    assert (work / "runs" / "first" / "bench.json").is_file()
    assert "report: runs/first/bench.json, chart: runs/first/bench.png" in stderr
    assert not (tmp_path / "state").exists()
    assert not (home / ".local").exists()


# -- bad input -------------------------------------------------------------------------


async def test_an_unreachable_engine_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    result = await bench(tmp_path, "--url", url, "--slo", "ttft_p95=1s")

    assert result.code == 1
    assert f"cannot reach the engine at {url}: connection refused" in result.stderr
    assert not result.report_dir.exists()


async def test_an_engine_without_metrics_is_refused_before_any_level(tmp_path: Path) -> None:
    with running("--without-metrics") as simulator:
        result = await bench(tmp_path, "--url", simulator.base_url, "--slo", "ttft_p95=1s")

    assert result.code == 1
    assert f"GET {simulator.base_url}/metrics answered HTTP 404" in result.stderr
    assert "target_waiting and kv_ceiling" in result.stderr
    assert "llamacpp: --metrics" in result.stderr
    assert not result.report_dir.exists()


async def test_an_slo_that_concurrency_one_breaks_ends_with_a_one_level_report(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    result = await bench(
        tmp_path, "--url", quick_engine.base_url, "--slo", "ttft_p95=10us", *QUICK_LEVELS
    )

    assert result.code == 1
    assert "llmgw-cli bench: even concurrency 1 broke the SLO: ttft_p95" in result.stderr
    report = result.report
    assert [level.concurrency for level in report.levels] == [1]
    assert report.stop_reason == "first_level_broken"
    assert report.capacity == 0
    assert report.recommendation is None


async def test_a_prompt_longer_than_the_engine_takes_is_refused_before_the_climb(
    tmp_path: Path,
) -> None:
    """Every prompt needs more KV blocks than the whole cache has: the simulator answers
    400, as an engine does a prompt longer than its context. One request of the run's
    shape finds it, before any level."""
    with running("--instant", "--num-blocks", "4") as simulator:
        result = await bench(
            tmp_path,
            *("--url", simulator.base_url, "--slo", "ttft_p95=1s"),
            *("--input-tokens", "200", "--output-tokens", "8"),
            *("--warmup", "500ms", "--duration", "3s"),
        )

    assert result.code == 1, result.stderr
    assert (
        "failed a request of the run's shape (--input-tokens 200, --output-tokens 8): "
        "HTTP 400: This model's maximum context length is 64 tokens. However, your request "
        "has 200 input tokens."
    ) in " ".join(result.stderr.split())
    assert "level 1 of" not in result.stderr
    assert not result.report_dir.exists()


async def test_an_engine_that_refuses_every_request_gets_a_few_per_level_and_is_named_once(
    proxy: tuple[str, RecordingProxy], tmp_path: Path
) -> None:
    """The engine answered the checks, then answers every request at once with a 400. Each
    level stops once nothing has succeeded, rather than send a whole window of requests."""
    url, recorder = proxy
    recorder.refuse_after = 2  # the probe and the check of the run's shape
    refusal = f"HTTP 400: {REFUSAL}"
    result = await bench(
        tmp_path,
        *("--url", url, "--slo", "ttft_p95=1s"),
        *("--input-tokens", "24", "--output-tokens", "4"),
        *("--warmup", "500ms", "--duration", "3s"),
        *("--start-concurrency", "2", "--max-concurrency", "2"),
    )

    assert result.code == 1, result.stderr
    report = result.report
    assert report.stop_reason == "first_level_broken"
    assert [level.concurrency for level in report.levels] == [2, 1]
    for level in report.levels:
        assert level.requests <= 2 * MIN_FAILURES, (level.concurrency, level.requests)
        assert (level.ended_early, level.succeeded, level.error_samples) == (True, 0, [refusal])
    assert "every request failed: the level stopped after" in result.stderr
    assert " ".join(result.stdout.split()).count(refusal) == 1, result.stdout


async def test_an_engine_that_dies_half_way_leaves_a_report_of_the_levels_that_ran(
    tmp_path: Path,
) -> None:
    with running("--decode-base-ms", "2", "--crash-after-requests", "40") as simulator:
        result = await bench(
            tmp_path, "--url", simulator.base_url, "--slo", "e2e_p99=10s", *QUICK_LEVELS
        )
        await wait_until(lambda: simulator.process.poll() is not None, what="the crash")

    assert result.code == 1
    assert f"the engine at {simulator.base_url}" in result.stderr.splitlines()[-1]
    report = result.report
    assert report.stop_reason == "failed"
    assert 1 <= len(report.levels) < 4
    assert report.recommendation is None
    assert "capacity: unknown, the bench stopped early" in result.stdout


async def test_sigterm_mid_climb_reports_the_levels_that_ran_as_they_were_logged(
    quick_engine: SimulatorProcess, tmp_path: Path
) -> None:
    """Output to pipes, as under ``nohup`` or in a CI job: each level's line arrives while
    the bench runs, and ``timeout``'s SIGTERM leaves the report of what ran."""
    report_dir = tmp_path / f"report-{random.getrandbits(32):08x}"
    process = await asyncio.create_subprocess_exec(
        CLI,
        *("bench", "--url", quick_engine.base_url, "--slo", "e2e_p99=10s"),
        *("--warmup", "100ms", "--duration", "1500ms", "--sample-interval", "50ms"),
        *("--input-tokens", "24", "--output-tokens", "4", "--report-dir", str(report_dir)),
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        for _ in range(2):
            planned = await asyncio.wait_for(process.stderr.readline(), CLI_TIMEOUT_S)
            assert planned.startswith(b"bench plan: "), planned
        first = await asyncio.wait_for(process.stderr.readline(), CLI_TIMEOUT_S)
        assert first.startswith(b"level 1 of at most "), first
        assert b": concurrency    1: met the SLO" in first, first
        process.terminate()
        stdout, rest = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert process.returncode == 1, rest
    assert rest.decode().splitlines()[-1] == "llmgw-cli bench: interrupted"
    report = msgspec.json.decode((report_dir / "bench.json").read_bytes(), type=BenchReport)
    assert report.stop_reason == "interrupted"
    assert [level.concurrency for level in report.levels] == [1]
    assert "capacity: unknown, the bench stopped early" in stdout.decode()


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (("--slo", "ttft_p95=1s"), "--url URL or --replica ID"),
        (("--url", "http://127.0.0.1:1"), "at least one latency target"),
        (("--url", "http://127.0.0.1:1", "--slo", "ttft_p95"), "LATENCY_pN=LIMIT"),
        (("--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s", "--apply-to", "replica",
          "--apply"), "--apply-to replica needs --replica"),
        (("--url", "http://127.0.0.1:1", "--slo", "ttft_p95=1s", "--apply-to", "replica"),
          "--apply-to replica needs --replica"),
        (("--url", "http://127.0.0.1:99999", "--slo", "ttft_p95=1s"),
          "--url 'http://127.0.0.1:99999': Port out of range 0-65535"),
    ],
)  # fmt: skip
async def test_bad_usage_exits_2_with_the_way_to_fix_it(
    flags: tuple[str, ...], complaint: str, tmp_path: Path
) -> None:
    result = await bench(tmp_path, *flags)

    assert result.code == 2
    assert complaint in result.stderr


# -- a replica of a cluster ------------------------------------------------------------


MODEL = "bench-sim"
NODE = "gpu-bench"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    pki = issue_pki(tmp_path_factory.mktemp("bench-pki"))
    pki.node(NODE)
    return pki


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(
    database_url: str, tmp_path: Path, pki: ClusterPki, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    directory = tmp_path / "cluster"
    directory.mkdir()
    async with Cluster(database_url, directory, pki) as cluster:
        add_cluster_logs_to_failed_reports(request, cluster)
        yield cluster


REPLICA_CAPACITY_4 = (
    *("--slo", "ttft_p99=150ms", "--start-concurrency", "4", "--max-concurrency", "5"),
)


async def serving_replica(cluster: Cluster) -> str:
    """One replica of a small simulated model, serving; its id."""
    cluster.start_server()
    await cluster.wait_for_leader()
    cluster.start_agent(NODE)
    await cluster.wait_for_nodes_connected([NODE])
    # 50 ms a token keeps each request in flight for a few hundred milliseconds, so the
    # samples of KV-cache usage (every 20 ms, QUICK_LEVELS) find it in use even on a busy
    # machine; at 2 ms a token a whole level could fall between two samples. With four
    # slots, four clients never wait (TTFT one step, 50 ms) and of five one always waits a
    # whole answer (four steps more, 250 ms): REPLICA_CAPACITY_4 breaks at 5.
    command = (
        f"{simulator_command()} --port {{port}} --model {{model}} --max-num-seqs 4 "
        "--decode-base-ms 50 --decode-per-seq-ms 0"
    )
    await cluster.apply_simulated_model(MODEL, replicas=1, command=command)
    serving: list[dict[str, object]] = []

    async def one_serving() -> bool:
        serving[:] = await cluster.replicas(model=MODEL, phase="serving")
        return len(serving) == 1

    await wait_until(one_serving, within_s=30.0, every_s=0.1, what="the replica serving")
    return str(serving[0]["id"])


async def test_apply_records_the_recommendation_with_its_summary_and_the_gateway_routes_by_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    replica_id = await serving_replica(cluster)
    admin = {"LLMGW_ADMIN_URL": cluster.servers[0].admin_url, "LLMGW_ADMIN_TOKEN": ADMIN_TOKEN}

    result = await bench(
        tmp_path,
        *("--replica", replica_id, *REPLICA_CAPACITY_4),
        *QUICK_LEVELS,
        "--apply",
        environment=admin,
    )

    assert result.code == 0, result.stderr
    report = result.report
    recommendation = report.recommendation
    assert recommendation is not None
    assert report.target.replica_id == replica_id
    assert report.applied is not None
    assert report.applied.changed
    assert f"applied to model {MODEL}: weight {recommendation.weight:g}" in result.stderr
    tuned = await cluster.wait_for_event("model_tuned")
    assert tuned.actor == "alice"
    assert (tuned.get("weight"), tuned.get("target_waiting"), tuned.get("kv_ceiling")) == (
        recommendation.weight,
        recommendation.target_waiting,
        recommendation.kv_ceiling,
    )
    summary = tuned.get("summary")
    assert isinstance(summary, dict)
    assert summary["source"] == "llmgw-cli bench"
    assert summary["capacity"] == report.capacity == 4
    assert summary["target"]["replica_id"] == replica_id
    assert summary["slo"] == ["ttft_p99 <= 150 ms"]
    connection = await asyncpg.connect(driver_url(cluster.database_url))
    try:
        snapshot = await read_snapshot(connection, within_s=5.0)
    finally:
        await connection.close()
    (route,) = snapshot.routes[MODEL]
    assert route.replica_id == replica_id
    assert route.url == report.target.url  # the engine bench measured is the one routed to
    assert (route.weight, route.target_waiting, route.kv_ceiling) == (
        pytest.approx(recommendation.weight),
        recommendation.target_waiting,
        pytest.approx(recommendation.kv_ceiling),
    )

    code, history, _ = await llmgw_cli(
        tmp_path, "history", "model", MODEL, "--output", "json", environment=admin
    )
    assert code == 0
    summaries = [event["summary"] for event in json.loads(history)]
    assert any(
        s.startswith(f"model {MODEL} tuned: weight {recommendation.weight:g}") for s in summaries
    )

    alone = await bench(
        tmp_path,
        *("--replica", replica_id, *REPLICA_CAPACITY_4),
        *QUICK_LEVELS,
        *("--apply", "--apply-to", "replica"),
        environment=admin,
    )
    assert alone.code == 0, alone.stderr
    assert f"applied to replica {replica_id}" in alone.stderr
    for_replica = await cluster.wait_for_event(
        "model_tuned", lambda event: event.get("replica_id") == replica_id
    )
    assert for_replica.position > tuned.position

    # Concurrency 2 is within the SLO and not the replica's limit: its queue and KV-cache
    # use are no ceiling, and --apply records nothing from them.
    below_capacity = await bench(
        tmp_path,
        *("--replica", replica_id, "--slo", "e2e_p99=10s", "--max-concurrency", "2"),
        *QUICK_LEVELS,
        "--apply",
        environment=admin,
    )
    assert below_capacity.code == 1, below_capacity.stderr
    assert "not reached within --max-concurrency 2" in below_capacity.stderr
    assert below_capacity.report.capacity_is_lower_bound
    assert below_capacity.report.recommendation is None
    assert below_capacity.report.applied is None
    _, history_after, _ = await llmgw_cli(
        tmp_path, "history", "model", MODEL, "--output", "json", environment=admin
    )
    tuned_events = [e for e in json.loads(history_after) if e["type"] == "model_tuned"]
    assert tuned_events[-1]["position"] == for_replica.position

    unknown = await bench(
        tmp_path, "--replica", f"{MODEL}-999", "--slo", "e2e_p99=10s", environment=admin
    )
    assert unknown.code == 1
    assert f"{MODEL}-999" in unknown.stderr


async def test_a_replica_that_stops_while_it_is_benched_is_named_as_stopped_not_as_unreachable(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An operator benches a replica; meanwhile its model is scaled down and the replica
    stops. The engine is then unreachable, and the line that ends the run says why: the
    replica stopped serving, not that something is wrong with the engine or the network."""
    replica_id = await serving_replica(cluster)
    admin = {"LLMGW_ADMIN_URL": cluster.servers[0].admin_url, "LLMGW_ADMIN_TOKEN": ADMIN_TOKEN}
    replica = await cluster.admin("GET", f"/admin/v1/replicas/{replica_id}")
    assert isinstance(replica, dict), replica
    [shard] = replica["shards"]
    engine_metrics = f"http://127.0.0.1:{shard['port']}/metrics"

    benched = asyncio.create_task(
        bench(
            tmp_path,
            *("--replica", replica_id, "--slo", "e2e_p99=10s"),
            *("--warmup", "100ms", "--duration", "60s", "--sample-interval", "50ms"),
            *("--input-tokens", "24", "--output-tokens", "4"),
            environment=admin,
        )
    )

    async def measuring() -> bool:
        async with httpx.AsyncClient() as client:
            page = (await client.get(engine_metrics)).text
        return any(
            line.startswith("vllm:num_requests_running") and float(line.rsplit(" ", 1)[1]) > 0
            for line in page.splitlines()
        )

    await wait_until(measuring, within_s=30.0, every_s=0.05, what="bench's requests running")
    await cluster.scale(MODEL, 0)
    result = await benched

    assert result.code == 1, result.stderr
    last_line = result.stderr.splitlines()[-1]
    assert f"replica {replica_id} stopped serving while bench ran" in last_line, last_line
    assert f"llmgw-cli history replica {replica_id}" in last_line


async def test_a_gateway_given_as_the_engine_is_refused_with_where_to_point_bench_instead(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An operator points bench at the gateway's OpenAI URL, the one clients use. The
    gateway asks for an API key, which bench never sends: it measures one engine, not the
    gateway's admission. The line says so, and what to give instead."""
    await serving_replica(cluster)
    gateway = f"http://127.0.0.1:{cluster.servers[0].client_port}/v1"

    result = await bench(tmp_path, "--url", gateway, "--slo", "e2e_p99=10s", *QUICK_LEVELS)

    assert result.code == 1, result.stderr
    last_line = result.stderr.splitlines()[-1]
    assert "answered HTTP 401" in last_line, last_line
    assert "bench sends no API key" in last_line, last_line
    assert "--replica" in last_line, last_line
