"""Gateway benchmark: what one gateway process adds to a request and how many it passes,
llmgw beside the Rust routers, in front of the same engine.

    python benchmarks/gateway.py [--engine simulator|llamacpp] [--sequential 1000]
        [--concurrency 50] [--rate 1000] [--seconds 5] [--rounds 3] [--max-tokens 16]
        [--routers [vllm-router sglang-router]] [--router-threads 1]
        [--load-generator wrk|aiohttp] [--no-request-log] [--gateway-processes 1]
        [--profile DIR [--profile-native]]
    python benchmarks/gateway.py --seconds 2 --rounds 1 --sequential 200   # to try it
    python benchmarks/gateway.py --medians benchmarks/results/gateway-*.json

One run, all against the same engine process:

* ``--engine simulator`` (the default): the simulator started with ``--instant`` (every
  simulated time zero, 1,024 sequences at once, so the engine itself never queues): what
  is measured is the proxy alone;
* ``--engine llamacpp``: llama.cpp's ``llama-server`` serving the real 270M-parameter model
  on the CPU, from the ``llamacpp`` extra, with the command the real-engine tests give it
  (``tests.support.real_engine``: one thread, 2 slots, ``--ignore-eos`` so that every
  answer is ``max_tokens`` long). Its defaults are small (``--sequential 20
  --concurrency 2 --seconds 10 --rounds 5 --max-tokens 8``, no open loop, no routers,
  aiohttp as the load): the engine's own latency, hundreds of milliseconds, dominates, and
  the figures that matter are the gateway's as ratios to direct in the same run. The
  direct requests open a connection each (``Connection: close``): llama-server drops some
  keep-alive connections after a streamed answer, which the gateway's engine client
  survives and aiohttp does not.

The contenders, each sent the same requests:

* **direct**: to the engine itself;
* **llmgw**: one gateway process (a child process on uvloop, ``StaticSource`` snapshot
  with one route and one key) with every feature of the request path on: the key checked,
  its rpm and tpm limits set (far above what the run reaches) so the limiter counts every
  request, admission (limits far out of reach: the proxy is measured, not admission
  control), metrics, the request log at ``info`` (``--no-request-log``: off);
  ``--gateway-processes N``: N such processes sharing one port (``--reuse-port``), the
  kernel spreading the connections, their CPU counted together;
* **vllm-router** and **sglang-router** (``--routers``; ``benchmarks/routers.py``): the
  Rust routers from their PyPI packages, installed on first use into a venv under
  ``~/.cache/llmgw-bench`` (skipped, with the reason, when they cannot be), with the
  engine as their one worker, ``round_robin``, and ``--router-threads`` tokio worker
  threads (1 by default, as llmgw has one event loop; 0: theirs, one per core).

For non-streaming and streaming requests alike, three kinds of load:

* ``--sequential`` requests one after another from aiohttp (latency p50/p99; for streams,
  time to the first body chunk too). One request at a time is not CPU-bound: the client's
  cost is the same for every contender and cancels out of the added figures;
* for each ``--concurrency`` level, that many connections sending back to back for
  ``--seconds`` (requests/s, latency p50/p99), from ``wrk`` with ``wrk_post.lua``
  (``benchmarks/wrk.py``; installed from the distribution when missing), which costs a
  fraction of the gateways' CPU per request (``client CPU ms/1000`` says how much), so the
  gateway is what saturates; ``--load-generator aiohttp`` uses the aiohttp client.
  Such closed-loop clients keep the machine saturated, so their latency is mostly
  queueing: ``clients / throughput``;
* for each ``--rate``, requests sent at that fixed rate for ``--seconds`` by aiohttp
  whether or not earlier ones have been answered (open loop), latency counted from when
  each was due: the latency a gateway adds at that load, if it keeps up.

Each phase is run ``--rounds`` times, every contender once a round, in an order that
rotates from round to round; the figures are the medians of the rounds. "Added" is a
contender's percentile minus direct's in the same round; the ratios (to direct and to
each peer) are per round too, then their median. CPU per 1,000 requests is each
contender's process tree (``/proc/<pid>/stat`` of it and its descendants, every thread)
over its own side; the load client's (this process, and wrk) is recorded beside it, and
the load average. llmgw's own ``x-llmgw-gateway-ms`` header is recorded too.
``--profile DIR`` samples llmgw with py-spy during the first round of the highest
concurrency, whole answers (that round is slower; ``benchmarks/profile_summary.py``
groups the samples).

Results are printed (per phase, then a comparison in the shape of issue 18's table and
the goals) and written to ``benchmarks/results/gateway-<timestamp>.json``;
``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import msgspec
import uvloop

from agent.simulator.launcher import free_port, simulator_command, start_simulator
from app.domain.egress import EngineNetworks
from app.domain.keys import format_key, hash_key
from app.gateway.table import GatewaySnapshot, KeyRecord, Route
from benchmarks.common import (
    format_table,
    load_average,
    median,
    percentile,
    stop_on_sigterm,
    write_results,
)
from benchmarks.routers import (
    ROUTERS,
    RouterProcess,
    cache_dir,
    ensure_installed,
    tree_cpu_s,
    tree_threads,
)
from benchmarks.routers import start as start_router
from benchmarks.routers import stop as stop_router
from benchmarks.wrk import INSTALL_HINT as WRK_INSTALL_HINT
from benchmarks.wrk import WrkRun, ensure_wrk, run_wrk
from devcluster.llamacpp import INSTALL_HINT, missing_packages
from tests.support.real_engine import installed_real_engine

MODEL = "bench-model"
PROMPT = "Tell me a short story about a gateway."
SIM_FLAGS = ("--instant", "--max-num-seqs", "1024", "--num-blocks", "65536")
START_TIMEOUT_S = 30.0
REAL_ENGINE_START_TIMEOUT_S = 120.0
"""llama-server loads the model in about 3 s alone; two busy shared cores can make that
many times longer."""
REAL_ENGINE_SLOTS = 2
ENGINES = ("simulator", "llamacpp")
DEFAULTS: dict[str, dict[str, Any]] = {
    "simulator": {
        "sequential": 1000,
        "concurrency": [50],
        "rate": [1000],
        "seconds": 5.0,
        "rounds": 3,
        "max_tokens": 16,
        "routers": list(ROUTERS),
        "load_generator": "wrk",
    },
    "llamacpp": {
        "sequential": 20,
        "concurrency": [REAL_ENGINE_SLOTS],
        "rate": [],
        "seconds": 10.0,
        "rounds": 5,
        "max_tokens": 8,
        "routers": [],
        "load_generator": "aiohttp",
    },
}
"""Per engine, what the load options are when not given: a real engine on the CPU answers
a few requests a second, not thousands."""
MAX_OUTSTANDING = 5000
"""Open-loop requests in flight at most; beyond, the load is not being kept up with."""
TARGET_SEQUENTIAL_P50_MS = 1.0
TARGET_SEQUENTIAL_P99_MS = 3.0
TARGET_RPS = 1000.0
TARGET_LOADED_P99_MS = 10.0
KEPT_UP = 0.98
"""An open loop kept up when this share of the offered rate was answered per second."""
GOAL_SEQUENTIAL_P50_MS = 0.5
GOAL_TTFB_P50_MS = 0.3
"""Issue 18's goals for llmgw, besides CPU and throughput against the Rust routers."""
DIRECT = "direct"
LLMGW = "llmgw"
BASELINE = "llmgw-baseline"
"""llmgw from another checkout (``--baseline DIR``), beside this one's in the same run."""
KEY_LIMIT = 1_000_000_000
"""The bench key's rpm and tpm: set, so that the rate limiter counts every request, and far
above what a run reaches."""
LLMGW_SETTINGS = (
    "one process on uvloop; one key (SHA-256 checked) with rpm and tpm limits set; "
    "admission on (target_waiting 1,000,000, kv_ceiling 1.01); metrics counted; request "
    "log on at info (an ordinary request's line is at debug, not rendered); the engine "
    "scraped 4 times a second"
)


# -- the gateway child process -------------------------------------------------------------


def serve_gateway(
    snapshot_path: Path, port: int, log_requests: bool, processes: int, reuse_port: bool
) -> None:
    """One gateway; with ``processes`` above 1, that many on one port (``reuse_port``): the
    others are this process's children (so that its tree's CPU is all of theirs), started
    and listening before it listens itself."""
    from app.gateway.server import Gateway, StaticSource
    from app.logs import configure_logging

    configure_logging("info", command="benchmarks/gateway.py", json=True)
    snapshot = msgspec.json.decode(snapshot_path.read_bytes(), type=GatewaySnapshot)
    siblings = []
    for _ in range(processes - 1):
        command = [sys.executable, __file__, "--serve-gateway", str(snapshot_path)]
        command += ["--port", str(port), REUSE_PORT]
        if not log_requests:
            command.append("--no-request-log")
        siblings.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE))
    for sibling in siblings:
        assert sibling.stdout is not None
        if sibling.stdout.readline().strip() != b"listening":
            raise SystemExit("a sibling gateway process did not start")

    async def run() -> None:
        source = StaticSource(snapshot)
        gateway = Gateway(
            source,
            host="127.0.0.1",
            port=port,
            log_requests=log_requests,
            engine_networks=EngineNetworks.parse("127.0.0.0/8"),
            reuse_port=reuse_port or processes > 1,
        )
        await gateway.start()
        print("listening", flush=True)
        if not siblings:
            await gateway.serve()  # SIGTERM, the benchmark's stop, ends the process
            return
        # With siblings, SIGTERM ends serve() so that they are stopped too: without a
        # handler the process would die at once and leave them running.
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        await stopped.wait()
        await gateway.stop()

    try:
        uvloop.run(run())
    finally:
        for sibling in siblings:
            sibling.terminate()
            sibling.wait(timeout=30)


REUSE_PORT = "--reuse-port"


def start_gateway(
    engine_url: str,
    workdir: Path,
    log_requests: bool,
    *,
    checkout: Path | None = None,
    name: str = LLMGW,
    processes: int = 1,
) -> tuple[subprocess.Popen[bytes], Target]:
    """llmgw's gateway as a child process: this checkout's, or ``checkout``'s (with its own
    ``.venv``), as the contender ``name``; ``processes`` of them on one port."""
    prefix = uuid.uuid4().hex[:8]
    key = format_key(prefix, uuid.uuid4().hex + uuid.uuid4().hex)
    record = KeyRecord(
        key_id=str(uuid.uuid4()),
        name="bench",
        prefix=prefix,
        secret_hash=hash_key(key),
        rpm=KEY_LIMIT,
        tpm=KEY_LIMIT,
    )
    # Admission far out of the way: the proxy is measured, not admission control.
    route = Route(
        replica_id=f"{MODEL}-1",
        model=MODEL,
        url=engine_url,
        target_waiting=1_000_000,
        kv_ceiling=1.01,
    )
    snapshot = GatewaySnapshot(
        declared=frozenset({MODEL}), routes={MODEL: (route,)}, keys={prefix: record}
    )
    snapshot_path = workdir / f"snapshot-{name}.json"
    snapshot_path.write_bytes(msgspec.json.encode(snapshot))
    port = free_port()
    if checkout is None:
        command = [sys.executable, __file__]
    else:
        command = [str(checkout / ".venv/bin/python"), str(checkout / "benchmarks/gateway.py")]
    command += ["--serve-gateway", str(snapshot_path), "--port", str(port)]
    if processes > 1:  # an older checkout's benchmark, a baseline's, may not know the flag
        command += ["--gateway-processes", str(processes)]
    if not log_requests:
        command.append("--no-request-log")
    with (workdir / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=checkout
        )
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    target = Target(name, f"http://127.0.0.1:{port}/v1/chat/completions", headers, process)
    return process, target


# -- load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a contender's requests go, and the process (tree) whose CPU is its cost."""

    name: str
    url: str
    headers: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    """None for direct: the engine's own CPU is counted apart."""


@dataclass
class Samples:
    latencies_ms: list[float] = field(default_factory=list)
    first_byte_ms: list[float] = field(default_factory=list)
    gateway_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: Counter[str] = field(default_factory=Counter)


class Load(msgspec.Struct, frozen=True):
    kind: str
    """``sequential``, ``clients`` (closed loop) or ``rate`` (open loop, per second)."""
    size: int

    def describe(self) -> str:
        if self.kind == "sequential":
            return "sequential"
        return f"{self.size} clients" if self.kind == "clients" else f"{self.size:,}/s"


async def one_request(
    session: aiohttp.ClientSession,
    target: Target,
    body: bytes,
    stream: bool,
    into: Samples,
    due: float | None = None,
) -> None:
    started = time.perf_counter() if due is None else due
    first: float | None = None
    added: str | None = None
    try:
        async with session.post(target.url, data=body, headers=target.headers) as response:
            if stream:
                async for _ in response.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
            else:
                await response.read()
            added = response.headers.get("x-llmgw-gateway-ms")
            ok = response.status == 200
    except aiohttp.ClientError as exc:
        into.error_kinds[type(exc).__name__] += 1
        ok = False
    else:
        if not ok:
            into.error_kinds[f"HTTP {response.status}"] += 1
    ended = time.perf_counter()
    if not ok:
        into.errors += 1
        return
    into.latencies_ms.append((ended - started) * 1000)
    if first is not None:
        into.first_byte_ms.append((first - started) * 1000)
    if added is not None:
        into.gateway_ms.append(float(added))


Send = Callable[[Samples, float | None], Coroutine[Any, Any, None]]


async def sequential(send: Send, count: int) -> Samples:
    samples = Samples()
    for _ in range(count):
        await send(samples, None)
    return samples


async def closed_loop(send: Send, clients: int, seconds: float) -> Samples:
    samples = Samples()
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            await send(samples, None)

    await asyncio.gather(*(client() for _ in range(clients)))
    return samples


async def open_loop(send: Send, rate: int, seconds: float) -> Samples:
    samples = Samples()
    started = time.perf_counter()
    pending: set[asyncio.Task[None]] = set()
    for number in range(int(rate * seconds)):
        due = started + number / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(pending) >= MAX_OUTSTANDING:
            samples.errors += 1
            samples.error_kinds["not sent: too many outstanding"] += 1
            continue
        task = asyncio.create_task(send(samples, due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    return samples


# -- results -------------------------------------------------------------------------------


class Side(msgspec.Struct, frozen=True, kw_only=True):
    """One contender's share of one round of a phase."""

    requests: int
    errors: int
    error_kinds: dict[str, int]
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    first_byte_p50_ms: float | None
    first_byte_p99_ms: float | None
    gateway_header_p50_ms: float | None
    gateway_header_p99_ms: float | None
    cpu_s: dict[str, float]
    """CPU time during this side: ``client`` (this process), ``wrk`` (when it was the
    load), the engine (``simulator`` or ``llama-server``) and every contender's process
    tree (by its name), whether it was the one measured or idle."""


class Round(msgspec.Struct, frozen=True, kw_only=True):
    order: list[str]
    """The contenders in the order they ran: it rotates from round to round."""
    sides: dict[str, Side]


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    """One contender's figures in a phase: medians over the rounds. The added figures and
    ratios are computed per round, against direct and each peer of the same round."""

    p50_ms: float
    p99_ms: float
    rps: float
    first_byte_p50_ms: float | None
    added_p50_ms: float
    added_p99_ms: float
    added_first_byte_p50_ms: float | None
    added_first_byte_p99_ms: float | None
    p50_ratio: float
    """Its p50 over direct's."""
    p99_ratio: float
    rps_ratio: float
    """Its requests/s over direct's."""
    gateway_header_p50_ms: float | None
    gateway_header_p99_ms: float | None
    cpu_ms_per_1000: float | None
    """Its own process tree's CPU per 1,000 requests answered (None for direct)."""
    client_cpu_ms_per_1000: float
    """The load client's CPU (this process, and wrk when it ran) per 1,000 requests."""
    cpu_cores_used: float
    """Client, engine and this contender: CPU per second of its side, what the run got."""
    rps_vs: dict[str, float]
    """Its requests/s over each peer's (not direct), per round, their median."""
    cpu_vs: dict[str, float]
    """Its CPU per request over each peer's."""
    errors: int


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    stream: bool
    load: Load
    generator: str
    """What sent the load: ``aiohttp`` (this process) or ``wrk``."""
    rounds: list[Round]
    contenders: dict[str, Figures]
    """By name, ``direct`` first."""
    load_average: tuple[float, float, float]
    """When the phase started: how busy the machine was besides this run."""


class MachineInfo(msgspec.Struct, frozen=True, kw_only=True):
    cpu_model: str
    cores: int
    system: str
    python: str


class ContenderInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    command: list[str]
    threads: int
    """Its process tree's threads once started."""
    settings: str


class Results(msgspec.Struct, frozen=True, kw_only=True):
    started_at: str
    machine: MachineInfo
    commit: str
    engine: str
    """``simulator`` or ``llamacpp``."""
    engine_command: list[str]
    contenders: list[ContenderInfo]
    skipped: dict[str, str]
    """Contenders asked for that did not run, and why."""
    load_average_before: tuple[float, float, float]
    load_average_after: tuple[float, float, float]
    sequential: int
    seconds: float
    rounds: int
    max_tokens: int
    request_log: bool
    phases: list[Phase]


def side(samples: Samples, seconds: float, cpu_s: dict[str, float]) -> Side:
    first = samples.first_byte_ms
    headers = samples.gateway_ms
    latencies = samples.latencies_ms or [float("nan")]
    return Side(
        requests=len(samples.latencies_ms),
        errors=samples.errors,
        error_kinds=dict(samples.error_kinds),
        seconds=seconds,
        rps=len(samples.latencies_ms) / seconds,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        first_byte_p50_ms=percentile(first, 50) if first else None,
        first_byte_p99_ms=percentile(first, 99) if first else None,
        gateway_header_p50_ms=percentile(headers, 50) if headers else None,
        gateway_header_p99_ms=percentile(headers, 99) if headers else None,
        cpu_s=cpu_s,
    )


def wrk_side(run: WrkRun, cpu_s: dict[str, float]) -> Side:
    return Side(
        requests=run.requests,
        errors=run.errors,
        error_kinds=run.error_kinds,
        seconds=run.seconds,
        rps=run.requests / run.seconds,
        p50_ms=run.p50_ms,
        p99_ms=run.p99_ms,
        first_byte_p50_ms=None,
        first_byte_p99_ms=None,
        gateway_header_p50_ms=None,
        gateway_header_p99_ms=None,
        cpu_s={**cpu_s, "wrk": run.cpu_s},
    )


def _median_of(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return median(present) if present else None


def _difference(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else first - second


def _ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; NaN where a side answered nothing."""
    return numerator / denominator if denominator else math.nan


def _client_cpu_s(one: Side) -> float:
    return one.cpu_s["client"] + one.cpu_s.get("wrk", 0.0)


def _cpu_per_request_s(one: Side, name: str) -> float:
    """The CPU of contender ``name``'s process tree per request of its side ``one``."""
    return one.cpu_s[name] / max(one.requests, 1)


def figures(name: str, rounds: list[Round], engine: str) -> Figures:
    def of(pick: Callable[[Side, Side], float]) -> float:
        return median([pick(r.sides[name], r.sides[DIRECT]) for r in rounds])

    def maybe(pick: Callable[[Side, Side], float | None]) -> float | None:
        return _median_of([pick(r.sides[name], r.sides[DIRECT]) for r in rounds])

    peers = [peer for peer in rounds[0].sides if peer not in (DIRECT, name)]
    rps_vs = {
        peer: median([_ratio(r.sides[name].rps, r.sides[peer].rps) for r in rounds])
        for peer in peers
    }
    cpu_vs: dict[str, float] = {}
    if name != DIRECT:
        for peer in peers:
            cpu_vs[peer] = median(
                [
                    _ratio(
                        _cpu_per_request_s(r.sides[name], name),
                        _cpu_per_request_s(r.sides[peer], peer),
                    )
                    for r in rounds
                ]
            )
    own_cpu = None if name == DIRECT else of(lambda s, _: _cpu_per_request_s(s, name) * 1e6)
    used = [engine, "client", "wrk"] + ([] if name == DIRECT else [name])
    return Figures(
        p50_ms=of(lambda s, _: s.p50_ms),
        p99_ms=of(lambda s, _: s.p99_ms),
        rps=of(lambda s, _: s.rps),
        first_byte_p50_ms=maybe(lambda s, _: s.first_byte_p50_ms),
        added_p50_ms=of(lambda s, d: s.p50_ms - d.p50_ms),
        added_p99_ms=of(lambda s, d: s.p99_ms - d.p99_ms),
        added_first_byte_p50_ms=maybe(
            lambda s, d: _difference(s.first_byte_p50_ms, d.first_byte_p50_ms)
        ),
        added_first_byte_p99_ms=maybe(
            lambda s, d: _difference(s.first_byte_p99_ms, d.first_byte_p99_ms)
        ),
        p50_ratio=of(lambda s, d: _ratio(s.p50_ms, d.p50_ms)),
        p99_ratio=of(lambda s, d: _ratio(s.p99_ms, d.p99_ms)),
        rps_ratio=of(lambda s, d: _ratio(s.rps, d.rps)),
        gateway_header_p50_ms=maybe(lambda s, _: s.gateway_header_p50_ms),
        gateway_header_p99_ms=maybe(lambda s, _: s.gateway_header_p99_ms),
        cpu_ms_per_1000=own_cpu,
        client_cpu_ms_per_1000=of(lambda s, _: _client_cpu_s(s) * 1e6 / max(s.requests, 1)),
        cpu_cores_used=of(lambda s, _: sum(s.cpu_s.get(key, 0.0) for key in used) / s.seconds),
        rps_vs=rps_vs,
        cpu_vs=cpu_vs,
        errors=sum(r.sides[name].errors for r in rounds),
    )


# -- the run -------------------------------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Engine:
    """The engine process under the contenders, however it was started."""

    name: str
    """``simulator`` or ``llama-server``: its key in the CPU times."""
    process: subprocess.Popen[bytes]
    base_url: str
    command: list[str]


@dataclass
class Setup:
    engine: Engine
    direct: Target
    contenders: list[Target]
    """Direct first, then llmgw, then the routers."""
    profile: Path | None
    wrk: str | None
    """wrk's path when it sends the closed-loop load, else None (aiohttp does)."""
    workdir: Path
    profile_native: bool = False
    """py-spy's ``--native``: C frames too (uvloop, httptools, the system calls)."""
    profiled: bool = False

    def cpu(self) -> dict[str, float]:
        used = {"client": own_cpu_s(), self.engine.name: process_cpu_s(self.engine.process.pid)}
        for target in self.contenders:
            if target.process is not None:
                used[target.name] = tree_cpu_s(target.process.pid)
        return used

    def llmgw(self) -> Target:
        return next(target for target in self.contenders if target.name == LLMGW)

    def start_profile(self, label: str) -> subprocess.Popen[bytes] | None:
        if self.profile is None or self.profiled:
            return None
        self.profiled = True
        process = self.llmgw().process
        assert process is not None
        py_spy = ensure_py_spy()
        if py_spy is None:
            print(f"--profile: no py-spy, and {shlex.join(PY_SPY_INSTALL)} failed", flush=True)
            return None
        self.profile.mkdir(parents=True, exist_ok=True)
        output = self.profile / f"llmgw-{label}.collapsed"
        command = [py_spy, "record", "--pid", str(process.pid), "--format", "raw"]
        command += ["--output", str(output), "--rate", "250"]
        # py-spy reads native stacks only from a paused process: such a profile slows the
        # gateway more (its proportions are what it is for).
        command.append("--native" if self.profile_native else "--nonblocking")
        print(
            f"  profiling llmgw: {shlex.join(command)}; load average {load_average()}", flush=True
        )
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


PY_SPY_INSTALL = [sys.executable, "-m", "pip", "install", "--quiet", "py-spy"]


def ensure_py_spy() -> str | None:
    """py-spy's path, installed into this venv when missing: a tool of the benchmark's,
    not a dependency of llmgw."""
    beside = Path(sys.executable).parent / "py-spy"
    found = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if found is None:
        print(f"installing py-spy: {shlex.join(PY_SPY_INSTALL)}", flush=True)
        subprocess.run(PY_SPY_INSTALL, capture_output=True, timeout=600)
        found = str(beside) if beside.exists() else None
    return found


async def wait_for_ready(
    session: aiohttp.ClientSession,
    url: str,
    process: subprocess.Popen[bytes],
    name: str = "the gateway",
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")


def request_body(stream: bool, max_tokens: int) -> bytes:
    message = {"role": "user", "content": PROMPT}
    request = {"model": MODEL, "messages": [message], "max_tokens": max_tokens, "stream": stream}
    return msgspec.json.encode(request)


def sender(
    session: aiohttp.ClientSession, target: Target, stream: bool, arguments: argparse.Namespace
) -> Send:
    body = request_body(stream, arguments.max_tokens)

    async def send(into: Samples, due: float | None) -> None:
        await one_request(session, target, body, stream, into, due)

    return send


async def run_side(
    session: aiohttp.ClientSession,
    setup: Setup,
    target: Target,
    stream: bool,
    load: Load,
    arguments: argparse.Namespace,
) -> Side:
    profiling = None
    if target.name == LLMGW and load == Load("clients", max(arguments.concurrency)) and not stream:
        profiling = setup.start_profile(f"{load.size}-clients")
    cpu_before = setup.cpu()
    started = time.perf_counter()
    run: WrkRun | None = None
    if load.kind == "clients" and setup.wrk is not None:
        body_path = setup.workdir / f"body-{'stream' if stream else 'whole'}.json"
        body_path.write_bytes(request_body(stream, arguments.max_tokens))
        run = await asyncio.to_thread(
            run_wrk,
            setup.wrk,
            target.url,
            target.headers,
            body_path,
            load.size,
            arguments.seconds,
            arguments.wrk_threads,
        )
    else:
        send = sender(session, target, stream, arguments)
        if load.kind == "sequential":
            samples = await sequential(send, arguments.sequential)
        elif load.kind == "clients":
            samples = await closed_loop(send, load.size, arguments.seconds)
        else:
            samples = await open_loop(send, load.size, arguments.seconds)
    seconds = time.perf_counter() - started
    cpu = {name: used - cpu_before[name] for name, used in setup.cpu().items()}
    if profiling is not None:
        profiling.send_signal(signal.SIGINT)
        profiling.wait()
    return wrk_side(run, cpu) if run is not None else side(samples, seconds, cpu)


async def run_phase(
    session: aiohttp.ClientSession,
    setup: Setup,
    stream: bool,
    load: Load,
    arguments: argparse.Namespace,
) -> Phase:
    rounds: list[Round] = []
    load_before = load_average()
    contenders = setup.contenders
    for number in range(arguments.rounds):
        shift = number % len(contenders)
        order = contenders[shift:] + contenders[:shift]
        sides = {
            target.name: await run_side(session, setup, target, stream, load, arguments)
            for target in order
        }
        rounds.append(Round(order=[target.name for target in order], sides=sides))
    by_name = {
        target.name: figures(target.name, rounds, setup.engine.name) for target in contenders
    }
    generator = "wrk" if load.kind == "clients" and setup.wrk is not None else "aiohttp"
    result = Phase(
        stream=stream,
        load=load,
        generator=generator,
        rounds=rounds,
        contenders=by_name,
        load_average=load_before,
    )
    shown = ", ".join(
        f"{name} {f.rps:,.0f}/s" + ("" if name == DIRECT else f" {f.added_p50_ms:+.3f} ms p50")
        for name, f in by_name.items()
    )
    print(
        f"  {'stream' if stream else 'whole'}, {load.describe()} ({generator}): {shown}", flush=True
    )
    return result


@contextmanager
def simulator_engine(workdir: Path) -> Iterator[Engine]:
    flags = (*SIM_FLAGS, "--model", MODEL)
    with start_simulator(*flags, log_path=workdir / "sim.log") as sim:
        sim.wait_healthy()
        command = [simulator_command(), "--port", str(sim.port), *flags]
        yield Engine("simulator", sim.process, sim.base_url, command)


@contextmanager
def llamacpp_engine(workdir: Path) -> Iterator[Engine]:
    """llama-server with the real model, as the real-engine tests start it; not yet ready
    (``/health`` answers 503 while the model loads)."""
    missing = missing_packages()
    if missing:
        raise SystemExit(f"--engine llamacpp needs {', '.join(missing)}: {INSTALL_HINT}")
    port = free_port()
    template = installed_real_engine().command(slots=REAL_ENGINE_SLOTS)
    command = shlex.split(template.format(host="127.0.0.1", port=port, model=MODEL))
    with (workdir / "llama-server.log").open("wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        yield Engine("llama-server", process, f"http://127.0.0.1:{port}", command)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def warm_up(
    session: aiohttp.ClientSession, setup: Setup, arguments: argparse.Namespace
) -> None:
    """Connections, caches and, for a real engine, its first requests (slower), out of
    the way: for a second, as many clients as the fewest ``--concurrency``, 20 at most."""
    clients = min(20, *arguments.concurrency)
    for stream in (False, True):
        for target in setup.contenders:
            await closed_loop(sender(session, target, stream, arguments), clients, 1.0)


def start_routers(
    arguments: argparse.Namespace, engine: Engine, workdir: Path, skipped: dict[str, str]
) -> list[RouterProcess]:
    names = list(arguments.routers)
    if not names:
        return []
    venv = Path(arguments.routers_venv) if arguments.routers_venv else cache_dir() / "routers"
    for name, reason in ensure_installed(names, venv).items():
        print(f"skipping {name}: {reason}", flush=True)
        skipped[name] = reason
    threads = arguments.router_threads or None
    started = []
    for name in names:
        if name in skipped:
            continue
        started.append(
            start_router(
                name,
                venv,
                engine.base_url,
                free_port(),
                free_port(),
                threads,
                workdir / f"{name}.log",
            )
        )
    return started


def router_settings(router: RouterProcess) -> str:
    threads = "tokio default (one per core)" if router.threads is None else str(router.threads)
    return f"policy round_robin, one worker, TOKIO_WORKER_THREADS {threads}"


async def run_all(arguments: argparse.Namespace, workdir: Path) -> Results:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = load_average()
    loads = [Load("sequential", 1)]
    loads += [Load("clients", clients) for clients in arguments.concurrency]
    loads += [Load("rate", rate) for rate in arguments.rate]
    real = arguments.engine == "llamacpp"
    skipped: dict[str, str] = {}
    wrk = None
    if arguments.load_generator == "wrk":
        wrk = ensure_wrk()
        if wrk is None:
            reason = f"wrk not found and not installable here ({WRK_INSTALL_HINT})"
            print(f"closed-loop load from aiohttp instead: {reason}", flush=True)
            skipped["wrk"] = reason
    with llamacpp_engine(workdir) if real else simulator_engine(workdir) as engine:
        gateway, through = start_gateway(
            engine.base_url,
            workdir,
            not arguments.no_request_log,
            processes=arguments.gateway_processes,
        )
        baselines = []
        if arguments.baseline:
            baselines.append(
                start_gateway(
                    engine.base_url,
                    workdir,
                    not arguments.no_request_log,
                    checkout=Path(arguments.baseline),
                    name=BASELINE,
                )
            )
        routers = start_routers(arguments, engine, workdir, skipped)
        direct_url = f"{engine.base_url}/v1/chat/completions"
        direct_headers = {"Content-Type": "application/json"}
        if real:
            # llama-server drops some keep-alive connections after a streamed answer
            # without a word; the gateway's engine client replaces such a connection
            # before it sends, aiohttp fails the request. A connection per direct request
            # costs a loopback connect, against answers of hundreds of milliseconds.
            direct_headers["Connection"] = "close"
        direct = Target(DIRECT, direct_url, direct_headers)
        router_targets = [
            Target(
                router.name,
                f"{_router_base(router)}/v1/chat/completions",
                {"Content-Type": "application/json"},
                router.process,
            )
            for router in routers
        ]
        profile = Path(arguments.profile) if arguments.profile else None
        contenders = [direct, through, *(target for _, target in baselines), *router_targets]
        setup = Setup(engine, direct, contenders, profile, wrk, workdir, arguments.profile_native)
        infos: list[ContenderInfo] = []
        try:
            # Idle connections are dropped before uvicorn's 5 s keep-alive can close them
            # under a request.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)
            async with aiohttp.ClientSession(connector=connector) as session:
                if real:
                    health = f"{engine.base_url}/health"
                    timeout = REAL_ENGINE_START_TIMEOUT_S
                    await wait_for_ready(session, health, engine.process, "llama-server", timeout)
                ready = through.url.replace("/v1/chat/completions", "/readyz")
                await wait_for_ready(session, ready, gateway)
                for process, target in baselines:
                    ready = target.url.replace("/v1/chat/completions", "/readyz")
                    await wait_for_ready(session, ready, process, target.name)
                for router in routers:
                    health = f"{_router_base(router)}/health"
                    await wait_for_ready(session, health, router.process, router.name)
                await warm_up(session, setup, arguments)
                infos.append(
                    ContenderInfo(
                        name=LLMGW,
                        command=[str(arg) for arg in gateway.args]
                        if isinstance(gateway.args, list)
                        else [str(gateway.args)],
                        threads=tree_threads(gateway.pid),
                        settings=LLMGW_SETTINGS
                        + ("" if not arguments.no_request_log else "; request log off")
                        + (
                            f"; {arguments.gateway_processes} processes on one port"
                            if arguments.gateway_processes > 1
                            else ""
                        ),
                    )
                )
                infos += [
                    ContenderInfo(
                        name=target.name,
                        command=[str(arg) for arg in process.args]
                        if isinstance(process.args, list)
                        else [str(process.args)],
                        threads=tree_threads(process.pid),
                        settings=f"{LLMGW_SETTINGS}, from {arguments.baseline}",
                    )
                    for process, target in baselines
                ]
                infos += [
                    ContenderInfo(
                        name=router.name,
                        command=router.command,
                        threads=tree_threads(router.process.pid),
                        settings=router_settings(router),
                    )
                    for router in routers
                ]
                for info in infos:
                    print(f"{info.name}: {info.threads} threads; {info.settings}", flush=True)
                phases = [
                    await run_phase(session, setup, stream, load, arguments)
                    for stream in (False, True)
                    for load in loads
                ]
        finally:
            for router in routers:
                stop_router(router.process)
            for process in (gateway, *(process for process, _ in baselines)):
                process.terminate()
                process.wait(timeout=30)
    return Results(
        started_at=started_at,
        machine=MachineInfo(
            cpu_model=_cpu_model(),
            cores=os.cpu_count() or 0,
            system=f"{platform.system()} {platform.release()}",
            python=platform.python_version(),
        ),
        commit=_commit(),
        engine=arguments.engine,
        engine_command=engine.command,
        contenders=infos,
        skipped=skipped,
        load_average_before=load_before,
        load_average_after=load_average(),
        sequential=arguments.sequential,
        seconds=arguments.seconds,
        rounds=arguments.rounds,
        max_tokens=arguments.max_tokens,
        request_log=not arguments.no_request_log,
        phases=phases,
    )


def _router_base(router: RouterProcess) -> str:
    port = router.command[router.command.index("--port") + 1]
    return f"http://127.0.0.1:{port}"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _commit() -> str:
    try:
        command = ["git", "rev-parse", "--short", "HEAD"]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -- reporting -----------------------------------------------------------------------------


def _pair(first: float | None, second: float | None, sign: str = "") -> str:
    if first is None or second is None:
        return ""
    return f"{first:{sign}.3f} / {second:{sign}.3f}"


def _phase_name(p: Phase) -> str:
    return f"{'stream' if p.stream else 'whole'}, {p.load.describe()}"


def report(results: Results) -> str:
    rps_digits = 2 if results.engine == "llamacpp" else 0
    rows = []
    for p in results.phases:
        for name, f in p.contenders.items():
            rows.append(
                [
                    f"{_phase_name(p)} ({p.generator})" if name == DIRECT else "",
                    name,
                    _pair(f.p50_ms, f.p99_ms),
                    "" if name == DIRECT else _pair(f.added_p50_ms, f.added_p99_ms, "+"),
                    ""
                    if name == DIRECT
                    else _pair(f.added_first_byte_p50_ms, f.added_first_byte_p99_ms, "+"),
                    f"{f.rps:,.{rps_digits}f}",
                    "" if name == DIRECT else f"{f.rps_ratio:.3f}",
                    _pair(f.gateway_header_p50_ms, f.gateway_header_p99_ms),
                    "" if f.cpu_ms_per_1000 is None else f"{f.cpu_ms_per_1000:,.0f}",
                    f"{f.client_cpu_ms_per_1000:,.0f}",
                    f"{f.cpu_cores_used:.2f}",
                    f"{p.load_average[0]:.1f}" if name == DIRECT else "",
                    str(f.errors),
                ]
            )
    headers = [
        "phase (load from)",
        "contender",
        "p50/p99 ms",
        "added p50/p99 ms",
        "added 1st byte p50/p99",
        "rps",
        "x direct rps",
        "header ms p50/p99",
        "CPU ms/1000 req",
        "client CPU ms/1000",
        "cores used",
        "load",
        "errors",
    ]
    return format_table(headers, rows)


def _find(results: Results, stream: bool, kind: str) -> Phase | None:
    return next((p for p in results.phases if p.stream == stream and p.load.kind == kind), None)


def comparison(results: Results) -> str:
    """The run in the shape of issue 18's table: one row per contender."""
    whole_seq = _find(results, False, "sequential")
    stream_seq = _find(results, True, "sequential")
    loaded = _find(results, False, "clients")
    if whole_seq is None or stream_seq is None or loaded is None:
        return ""
    rows = []
    for name in loaded.contenders:
        f = loaded.contenders[name]
        whole = whole_seq.contenders[name]
        ttfb = stream_seq.contenders[name].added_first_byte_p50_ms
        latency = (
            "-"
            if name == DIRECT
            else f"{whole.added_p50_ms:+.2f} ms / {ttfb:+.2f} ms"
            if ttfb is not None
            else f"{whole.added_p50_ms:+.2f} ms / -"
        )
        throughput = f"{f.rps:,.0f}/s" + ("" if name == DIRECT else f" ({f.rps_ratio:.2f}x)")
        peers_rps = ", ".join(f"{ratio:.2f}x {peer}" for peer, ratio in f.rps_vs.items())
        peers_cpu = ", ".join(f"{ratio:.2f}x {peer}" for peer, ratio in f.cpu_vs.items())
        rows.append(
            [
                name,
                latency,
                throughput,
                "-" if name == DIRECT else f"{f.added_p99_ms:+.1f} ms",
                "-" if f.cpu_ms_per_1000 is None else f"{f.cpu_ms_per_1000:,.0f} ms",
                peers_rps or "-",
                peers_cpu or "-",
            ]
        )
    size = loaded.load.size
    headers = [
        "contender",
        "sequential added p50 (whole / stream TTFB)",
        f"rps at {size} conn.",
        f"added p99 at {size}",
        "CPU per 1,000 req",
        "rps vs peers",
        "CPU vs peers",
    ]
    client = loaded.contenders[DIRECT].client_cpu_ms_per_1000
    through = [
        f"{name} {f.client_cpu_ms_per_1000:,.0f}"
        for name, f in loaded.contenders.items()
        if name != DIRECT
    ]
    note = (
        f"\nload client ({loaded.generator}) CPU per 1,000 requests at {size} connections, "
        f"whole: direct {client:,.0f} ms; through {', '.join(through)} ms"
    )
    return format_table(headers, rows) + note


def _ratio_text(ratios: dict[str, list[float]]) -> str:
    return ", ".join(f"{median(values):.2f}x {peer}" for peer, values in ratios.items()) or "-"


def medians_table(runs: Sequence[Results]) -> str:
    """Several runs' comparisons, as a Markdown table of their medians in the shape of
    issue 18's (``--medians FILE...``)."""
    rows = []
    found = [
        (_find(r, False, "sequential"), _find(r, True, "sequential"), _find(r, False, "clients"))
        for r in runs
    ]
    complete = [(w, s, c) for w, s, c in found if w and s and c]
    if not complete:
        return "no run with sequential and closed-loop phases"
    opened = [_find(r, False, "rate") for r in runs]
    names = list(complete[0][2].contenders)
    size = complete[0][2].load.size
    for name in names:
        loaded = [c.contenders[name] for _, _, c in complete if name in c.contenders]
        whole = [w.contenders[name] for w, _, _ in complete if name in w.contenders]
        stream = [s.contenders[name] for _, s, _ in complete if name in s.contenders]
        rps = f"{median([f.rps for f in loaded]):,.0f}/s"
        client = f"{median([f.client_cpu_ms_per_1000 for f in loaded]):,.0f} ms"
        if name == DIRECT:
            rows.append(f"| {name} | - | {rps} | - | - | {client} | - | - |")
            continue
        ttfbs = [f.added_first_byte_p50_ms for f in stream if f.added_first_byte_p50_ms is not None]
        ttfb = f"{median(ttfbs):+.2f} ms" if ttfbs else "-"
        latency = f"{median([f.added_p50_ms for f in whole]):+.2f} ms / {ttfb}"
        rps += f" ({median([f.rps_ratio for f in loaded]):.2f}x direct)"
        cpu = [f.cpu_ms_per_1000 for f in loaded if f.cpu_ms_per_1000 is not None]
        rps_vs: dict[str, list[float]] = {}
        cpu_vs: dict[str, list[float]] = {}
        for f in loaded:
            for peer, ratio in f.rps_vs.items():
                rps_vs.setdefault(peer, []).append(ratio)
            for peer, ratio in f.cpu_vs.items():
                cpu_vs.setdefault(peer, []).append(ratio)
        rate = [p.contenders[name] for p in opened if p is not None and name in p.contenders]
        open_loop = (
            f"{median([f.added_p50_ms for f in rate]):+.2f} / "
            f"{median([f.added_p99_ms for f in rate]):+.2f} ms"
            if rate
            else "-"
        )
        rows.append(
            f"| {name} | {latency} | {rps} | {median([f.added_p99_ms for f in loaded]):+.1f} ms "
            f"| {median(cpu):,.0f} ms | {client} "
            f"| {_ratio_text(rps_vs)}; CPU {_ratio_text(cpu_vs)} "
            f"| {open_loop} |"
        )
    rate_label = next((f"{p.load.size:,}/s" for p in opened if p is not None), "open loop")
    header = [
        f"| contender | sequential added p50 (whole / stream TTFB) | throughput at {size} "
        f"connections | added p99 at {size} | CPU per 1,000 requests | load client's CPU per "
        f"1,000 | throughput and CPU against each peer | added p50 / p99 at {rate_label} |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    return "\n".join(header + rows)


def verdict(results: Results) -> list[str]:
    if results.engine == "llamacpp":
        return ratios(results)
    lines = []
    for p in results.phases:
        if p.stream:
            continue
        f = p.contenders[LLMGW]
        if p.load.kind == "sequential":
            met = f.added_p50_ms <= TARGET_SEQUENTIAL_P50_MS
            met = met and f.added_p99_ms <= TARGET_SEQUENTIAL_P99_MS
            target = f"p50 <= {TARGET_SEQUENTIAL_P50_MS} ms, p99 <= {TARGET_SEQUENTIAL_P99_MS} ms"
        else:
            # An open loop's rate is what was offered: it is met if the gateway kept up.
            kept_up = p.load.kind == "rate" and f.rps >= KEPT_UP * p.load.size
            fast_enough = f.rps >= TARGET_RPS or (kept_up and p.load.size >= TARGET_RPS)
            met = fast_enough and f.added_p99_ms <= TARGET_LOADED_P99_MS
            target = f">= {TARGET_RPS:,.0f}/s with added p99 <= {TARGET_LOADED_P99_MS} ms"
        lines.append(
            f"{p.load.describe()}: {f.rps:,.0f}/s through llmgw, added p50 "
            f"{f.added_p50_ms:.3f} ms, p99 {f.added_p99_ms:.3f} ms (target {target}): "
            f"{'met' if met else 'not met'}"
        )
    return lines + goals(results)


def goals(results: Results) -> list[str]:
    """Issue 18's goals for llmgw against the Rust routers of the same run."""
    whole_seq = _find(results, False, "sequential")
    stream_seq = _find(results, True, "sequential")
    loaded = _find(results, False, "clients")
    if whole_seq is None or stream_seq is None or loaded is None:
        return []
    ours = loaded.contenders[LLMGW]
    lines = []
    vllm = loaded.contenders.get("vllm-router")
    if vllm is not None and vllm.cpu_ms_per_1000 is not None and ours.cpu_ms_per_1000:
        met = ours.cpu_ms_per_1000 <= vllm.cpu_ms_per_1000
        lines.append(
            f"CPU per 1,000 requests <= vllm-router's: {ours.cpu_ms_per_1000:,.0f} ms against "
            f"{vllm.cpu_ms_per_1000:,.0f}: {'met' if met else 'not met'}"
        )
    routers = [loaded.contenders[name] for name in ROUTERS if name in loaded.contenders]
    if routers:
        best = max(router.rps for router in routers)
        met = ours.rps >= best
        lines.append(
            f"throughput at {loaded.load.size} connections >= the faster router's: "
            f"{ours.rps:,.0f}/s against {best:,.0f}/s: {'met' if met else 'not met'}"
        )
    added = whole_seq.contenders[LLMGW].added_p50_ms
    lines.append(
        f"sequential added p50 <= {GOAL_SEQUENTIAL_P50_MS} ms: {added:.3f} ms: "
        f"{'met' if added <= GOAL_SEQUENTIAL_P50_MS else 'not met'}"
    )
    ttfb = stream_seq.contenders[LLMGW].added_first_byte_p50_ms
    if ttfb is not None:
        lines.append(
            f"streaming added TTFB p50 <= {GOAL_TTFB_P50_MS} ms: {ttfb:.3f} ms: "
            f"{'met' if ttfb <= GOAL_TTFB_P50_MS else 'not met'}"
        )
    return lines


def ratios(results: Results) -> list[str]:
    """A real engine's run: the targets are the proxy's against an instant engine; here,
    what share of a request's time and of the throughput the gateway costs."""
    lines = []
    for p in results.phases:
        f = p.contenders[LLMGW]
        share = f.added_p50_ms / f.p50_ms
        lines.append(
            f"{_phase_name(p)}: through llmgw "
            f"p50 x{f.p50_ratio:.3f} ({f.added_p50_ms:+.1f} ms, {share:.1%} of a request), "
            f"p99 x{f.p99_ratio:.3f}, requests/s x{f.rps_ratio:.3f}"
        )
    return lines


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(item) for item in value) or "(none)"
    return f"{value:g}" if isinstance(value, float) else str(value)


def parser() -> argparse.ArgumentParser:
    described = argparse.ArgumentParser(
        description="Gateway benchmark: llmgw, the Rust routers and direct, in front of one "
        "engine (the module docstring says it all).",
        epilog="engine defaults: "
        + "; ".join(
            f"{engine}: "
            + ", ".join(
                f"--{name.replace('_', '-')} {_shown(value)}" for name, value in given.items()
            )
            for engine, given in DEFAULTS.items()
        ),
    )
    add = described.add_argument
    add("--engine", choices=ENGINES, default="simulator", help="default: simulator")
    add("--sequential", type=int, help="requests one after another per phase (engine default)")
    add("--concurrency", type=int, nargs="+", help="closed-loop connections (engine default)")
    add(
        "--rate",
        type=int,
        nargs="*",
        help="open-loop offered rates per second (engine default; none: --rate)",
    )
    add("--seconds", type=float, help="length of each closed- and open-loop side (engine default)")
    add(
        "--rounds",
        type=int,
        help="rounds per phase; the contenders' order rotates (engine default)",
    )
    add("--max-tokens", type=int, help="of every request (engine default)")
    add(
        "--routers",
        nargs="*",
        choices=ROUTERS,
        help="Rust routers to compare "
        "(default: both with the simulator, none with llamacpp; none: --routers)",
    )
    add(
        "--router-threads",
        type=int,
        default=1,
        help="TOKIO_WORKER_THREADS of each router; 0 leaves their default (one per core); "
        "default: 1",
    )
    add(
        "--routers-venv",
        metavar="DIR",
        help="their venv (default: ~/.cache/llmgw-bench/routers, or $LLMGW_BENCH_CACHE/routers)",
    )
    add(
        "--load-generator",
        choices=("wrk", "aiohttp"),
        help="what sends the closed-loop load (default: wrk with the simulator, else aiohttp)",
    )
    add("--wrk-threads", type=int, default=1, help="wrk's -t (default: 1)")
    add(
        "--baseline",
        metavar="CHECKOUT",
        help="also run the gateway of another checkout (its .venv's python) as the "
        f"contender {BASELINE}, to compare code before and after a change in one run",
    )
    add("--no-request-log", action="store_true", help="llmgw without its request log")
    add(
        "--gateway-processes",
        type=int,
        default=1,
        help="llmgw as that many gateway processes sharing one port (--reuse-port); "
        "its CPU is theirs together; default: 1",
    )
    add(
        "--profile",
        metavar="DIR",
        help="py-spy llmgw during the first round of the "
        "highest concurrency, whole answers (DIR/llmgw-N-clients.collapsed)",
    )
    add("--profile-native", action="store_true", help="py-spy --native: C frames too")
    add("--workdir", metavar="DIR", help="keep the logs here")
    add(
        "--medians",
        metavar="RESULTS",
        nargs="+",
        help="run nothing: print the medians of "
        "these results files (benchmarks/results/gateway-*.json) as one Markdown table",
    )
    add("--serve-gateway", metavar="SNAPSHOT", help=argparse.SUPPRESS)
    add("--port", type=int, help=argparse.SUPPRESS)
    add(REUSE_PORT, action="store_true", help=argparse.SUPPRESS)
    return described


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parser().parse_args(argv)
    if arguments.gateway_processes < 1:
        parser().error("--gateway-processes must be at least 1")
    if arguments.serve_gateway:
        serve_gateway(
            Path(arguments.serve_gateway),
            arguments.port,
            not arguments.no_request_log,
            arguments.gateway_processes,
            arguments.reuse_port,
        )
        return 0
    if arguments.medians:
        runs = []
        for path in arguments.medians:
            try:
                runs.append(msgspec.json.decode(Path(path).read_bytes(), type=Results))
            except (OSError, msgspec.DecodeError) as exc:
                # A run with a side that answered nothing has NaN ratios, written as null.
                print(f"--medians: {path}: {exc}", file=sys.stderr)
                return 2
        print(medians_table(runs))
        return 0
    for name, value in DEFAULTS[arguments.engine].items():
        if getattr(arguments, name) is None:
            setattr(arguments, name, value)
    if arguments.baseline:
        arguments.baseline = str(Path(arguments.baseline).resolve())
    if arguments.workdir:
        workdir = Path(arguments.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="llmgw-gateway-bench-"))
    results = uvloop.run(run_all(arguments, workdir))
    print()
    print(report(results))
    print()
    table = comparison(results)
    if table:
        print(table)
        print()
    for line in verdict(results):
        print(line)
    for name, reason in results.skipped.items():
        print(f"skipped {name}: {reason}")
    path = write_results("gateway", results)
    print(f"\nresults: {path}\nlogs: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
