"""Gateway benchmark: what one gateway process adds to a request, and how many it passes.

    python benchmarks/gateway.py [--engine simulator|llamacpp] [--sequential 2000]
        [--concurrency 50 200] [--rate 1000] [--seconds 5] [--rounds 3] [--max-tokens 16]
        [--no-request-log] [--profile DIR]

One run, all against the same engine process:

* ``--engine simulator`` (the default): the simulator started with ``--instant`` (every
  simulated time zero, 1,024 sequences at once, so the engine itself never queues): what
  is measured is the proxy alone;
* ``--engine llamacpp``: llama.cpp's ``llama-server`` serving the real 270M-parameter model
  on the CPU, from the ``llamacpp`` extra, with the command the real-engine tests give it
  (``tests.support.real_engine``: one thread, 2 slots, ``--ignore-eos`` so that every
  answer is ``max_tokens`` long). Its defaults are small (``--sequential 20
  --concurrency 2 --seconds 10 --rounds 5 --max-tokens 8``, no open loop): the engine's
  own latency, hundreds of milliseconds, dominates, and the figures that matter are the
  gateway's as ratios to direct in the same run. The direct requests open a connection
  each (``Connection: close``): llama-server drops some keep-alive connections after a
  streamed answer, which the gateway's engine client survives and aiohttp does not.

For both:

* **direct**: the load client posts to the engine;
* **gateway**: the same requests through one gateway process (a child process on uvloop,
  ``StaticSource`` snapshot with one route and one key, request log on, to a file), whose
  route has admission limits far above what the run reaches, so what is measured is the
  proxy, not admission control.

For non-streaming and streaming requests alike, three kinds of load:

* ``--sequential`` requests one after another (latency p50/p99; for streams, time to the
  first body chunk too);
* for each ``--concurrency`` level, that many clients sending back to back for
  ``--seconds`` (requests/s, latency p50/p99). Such closed-loop clients keep the machine
  saturated, so their latency is mostly queueing: ``clients / throughput``;
* for each ``--rate``, requests sent at that fixed rate for ``--seconds`` whether or not
  earlier ones have been answered (open loop), latency counted from when each was due:
  the latency a gateway adds at that load, if it keeps up.

Each phase is run ``--rounds`` times, direct and gateway alternating (which goes first
alternates too); the figures are the medians of the rounds. "Added" is the gateway's
percentile minus the direct one; the ratios are the gateway's p50, p99 and requests/s
over the direct ones, each round's, then their median. The gateway's own
``x-llmgw-gateway-ms`` header, each process's CPU time, and the load average are recorded
too: the load client is aiohttp on uvloop in this process, and on a small machine it, the
gateway, the engine and whatever else runs there share the CPU. ``--profile DIR`` samples
the gateway with py-spy during the first round of the highest concurrency, non-streaming
(that round is slower).

Results are printed and written to ``benchmarks/results/gateway-<timestamp>.json``;
``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
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
from benchmarks.common import format_table, load_average, median, percentile, write_results
from tests.support.real_engine import INSTALL_HINT, installed_real_engine, missing_packages

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
        "sequential": 2000,
        "concurrency": [50, 200],
        "rate": [1000],
        "seconds": 5.0,
        "rounds": 3,
        "max_tokens": 16,
    },
    "llamacpp": {
        "sequential": 20,
        "concurrency": [REAL_ENGINE_SLOTS],
        "rate": [],
        "seconds": 10.0,
        "rounds": 5,
        "max_tokens": 8,
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


# -- the gateway child process -------------------------------------------------------------


def serve_gateway(snapshot_path: Path, port: int, log_requests: bool) -> None:
    from app.gateway.server import Gateway, StaticSource
    from app.logs import configure_logging

    configure_logging("info", json=True)
    snapshot = msgspec.json.decode(snapshot_path.read_bytes(), type=GatewaySnapshot)

    async def run() -> None:
        source = StaticSource(snapshot)
        gateway = Gateway(
            source,
            host="127.0.0.1",
            port=port,
            log_requests=log_requests,
            engine_networks=EngineNetworks.parse("127.0.0.0/8"),
        )
        await gateway.start()
        await gateway.serve()

    uvloop.run(run())


def start_gateway(
    engine_url: str, workdir: Path, log_requests: bool
) -> tuple[subprocess.Popen[bytes], Target]:
    prefix = uuid.uuid4().hex[:8]
    key = format_key(prefix, uuid.uuid4().hex + uuid.uuid4().hex)
    record = KeyRecord(
        key_id=str(uuid.uuid4()), name="bench", prefix=prefix, secret_hash=hash_key(key)
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
    snapshot_path = workdir / "snapshot.json"
    snapshot_path.write_bytes(msgspec.json.encode(snapshot))
    port = free_port()
    command = [sys.executable, __file__, "--serve-gateway", str(snapshot_path)]
    command += ["--port", str(port)]
    if not log_requests:
        command.append("--no-request-log")
    with (workdir / "gateway.log").open("wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    target = Target("gateway", f"http://127.0.0.1:{port}/v1/chat/completions", headers)
    return process, target


# -- load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    headers: dict[str, str]


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
    """CPU time of the load client, the gateway and the engine (``simulator`` or
    ``llama-server``) during this side."""


class Round(msgspec.Struct, frozen=True, kw_only=True):
    direct: Side
    gateway: Side


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    stream: bool
    load: Load
    rounds: list[Round]
    direct_p50_ms: float
    direct_p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    added_first_byte_p50_ms: float | None
    added_first_byte_p99_ms: float | None
    direct_rps: float
    gateway_rps: float
    p50_ratio: float
    """The gateway's p50 over the direct one, per round, their median."""
    p99_ratio: float
    rps_ratio: float
    """The gateway's requests/s over the direct ones, per round, their median."""
    gateway_header_p50_ms: float | None
    gateway_header_p99_ms: float | None
    gateway_cpu_ms_per_request: float
    cpu_cores_used: float
    """All three processes' CPU per second of the gateway side: what the run got."""
    load_average: tuple[float, float, float]
    """When the phase started: how busy the machine was besides this run."""


class MachineInfo(msgspec.Struct, frozen=True, kw_only=True):
    cpu_model: str
    cores: int
    system: str
    python: str


class Results(msgspec.Struct, frozen=True, kw_only=True):
    started_at: str
    machine: MachineInfo
    commit: str
    engine: str
    """``simulator`` or ``llamacpp``."""
    engine_command: list[str]
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
    return Side(
        requests=len(samples.latencies_ms),
        errors=samples.errors,
        error_kinds=dict(samples.error_kinds),
        seconds=seconds,
        rps=len(samples.latencies_ms) / seconds,
        p50_ms=percentile(samples.latencies_ms, 50),
        p99_ms=percentile(samples.latencies_ms, 99),
        first_byte_p50_ms=percentile(first, 50) if first else None,
        first_byte_p99_ms=percentile(first, 99) if first else None,
        gateway_header_p50_ms=percentile(headers, 50) if headers else None,
        gateway_header_p99_ms=percentile(headers, 99) if headers else None,
        cpu_s=cpu_s,
    )


def _median_of(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return median(present) if present else None


def _difference(gateway: float | None, direct: float | None) -> float | None:
    return None if gateway is None or direct is None else gateway - direct


def phase(
    stream: bool, load: Load, rounds: list[Round], load_average: tuple[float, float, float]
) -> Phase:
    def of(pick: Callable[[Round], float]) -> float:
        return median([pick(r) for r in rounds])

    return Phase(
        stream=stream,
        load=load,
        rounds=rounds,
        direct_p50_ms=of(lambda r: r.direct.p50_ms),
        direct_p99_ms=of(lambda r: r.direct.p99_ms),
        gateway_p50_ms=of(lambda r: r.gateway.p50_ms),
        gateway_p99_ms=of(lambda r: r.gateway.p99_ms),
        added_p50_ms=of(lambda r: r.gateway.p50_ms - r.direct.p50_ms),
        added_p99_ms=of(lambda r: r.gateway.p99_ms - r.direct.p99_ms),
        added_first_byte_p50_ms=_median_of(
            [_difference(r.gateway.first_byte_p50_ms, r.direct.first_byte_p50_ms) for r in rounds]
        ),
        added_first_byte_p99_ms=_median_of(
            [_difference(r.gateway.first_byte_p99_ms, r.direct.first_byte_p99_ms) for r in rounds]
        ),
        direct_rps=of(lambda r: r.direct.rps),
        gateway_rps=of(lambda r: r.gateway.rps),
        p50_ratio=of(lambda r: r.gateway.p50_ms / r.direct.p50_ms),
        p99_ratio=of(lambda r: r.gateway.p99_ms / r.direct.p99_ms),
        rps_ratio=of(lambda r: r.gateway.rps / r.direct.rps),
        gateway_header_p50_ms=_median_of([r.gateway.gateway_header_p50_ms for r in rounds]),
        gateway_header_p99_ms=_median_of([r.gateway.gateway_header_p99_ms for r in rounds]),
        gateway_cpu_ms_per_request=of(
            lambda r: r.gateway.cpu_s["gateway"] * 1000 / max(r.gateway.requests, 1)
        ),
        cpu_cores_used=of(lambda r: sum(r.gateway.cpu_s.values()) / r.gateway.seconds),
        load_average=load_average,
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
    """The engine process under the gateway, however it was started."""

    name: str
    """``simulator`` or ``llama-server``: its key in the CPU times."""
    process: subprocess.Popen[bytes]
    base_url: str
    command: list[str]


@dataclass
class Setup:
    engine: Engine
    gateway: subprocess.Popen[bytes]
    direct: Target
    through: Target
    profile: Path | None
    profiled: bool = False

    def cpu(self) -> dict[str, float]:
        return {
            "client": own_cpu_s(),
            "gateway": process_cpu_s(self.gateway.pid),
            self.engine.name: process_cpu_s(self.engine.process.pid),
        }

    def start_profile(self, label: str) -> subprocess.Popen[bytes] | None:
        if self.profile is None or self.profiled:
            return None
        self.profiled = True
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        output = self.profile / f"gateway-{label}.collapsed"
        command = [py_spy, "record", "--pid", str(self.gateway.pid), "--format", "raw"]
        command += ["--output", str(output), "--rate", "250", "--nonblocking"]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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


async def run_phase(
    session: aiohttp.ClientSession,
    setup: Setup,
    stream: bool,
    load: Load,
    arguments: argparse.Namespace,
) -> Phase:
    rounds: list[Round] = []
    load_before = load_average()
    for number in range(arguments.rounds):
        order = [setup.direct, setup.through] if number % 2 == 0 else [setup.through, setup.direct]
        sides: dict[str, Side] = {}
        for target in order:
            send = sender(session, target, stream, arguments)
            profiling = None
            top_load = Load("clients", max(arguments.concurrency))
            if target is setup.through and load == top_load and not stream:
                profiling = setup.start_profile(f"{load.size}-clients")
            cpu_before = setup.cpu()
            started = time.perf_counter()
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
            sides[target.name] = side(samples, seconds, cpu)
        rounds.append(Round(direct=sides["direct"], gateway=sides["gateway"]))
    result = phase(stream, load, rounds, load_before)
    print(
        f"  {'stream' if stream else 'whole'}, {load.describe()}: added p50 "
        f"{result.added_p50_ms:+.3f} ms, p99 {result.added_p99_ms:+.3f} ms; requests/s "
        f"direct {result.direct_rps:,.0f}, gateway {result.gateway_rps:,.0f}",
        flush=True,
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
        for target in (setup.direct, setup.through):
            await closed_loop(sender(session, target, stream, arguments), clients, 1.0)


async def run_all(arguments: argparse.Namespace, workdir: Path) -> Results:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = load_average()
    loads = [Load("sequential", 1)]
    loads += [Load("clients", clients) for clients in arguments.concurrency]
    loads += [Load("rate", rate) for rate in arguments.rate]
    real = arguments.engine == "llamacpp"
    with llamacpp_engine(workdir) if real else simulator_engine(workdir) as engine:
        gateway, through = start_gateway(engine.base_url, workdir, not arguments.no_request_log)
        direct_url = f"{engine.base_url}/v1/chat/completions"
        direct_headers = {"Content-Type": "application/json"}
        if real:
            # llama-server drops some keep-alive connections after a streamed answer
            # without a word; the gateway's engine client replaces such a connection
            # before it sends, aiohttp fails the request. A connection per direct request
            # costs a loopback connect, against answers of hundreds of milliseconds.
            direct_headers["Connection"] = "close"
        direct = Target("direct", direct_url, direct_headers)
        profile = Path(arguments.profile) if arguments.profile else None
        setup = Setup(engine, gateway, direct, through, profile)
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
                await warm_up(session, setup, arguments)
                phases = [
                    await run_phase(session, setup, stream, load, arguments)
                    for stream in (False, True)
                    for load in loads
                ]
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
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
        load_average_before=load_before,
        load_average_after=load_average(),
        sequential=arguments.sequential,
        seconds=arguments.seconds,
        rounds=arguments.rounds,
        max_tokens=arguments.max_tokens,
        request_log=not arguments.no_request_log,
        phases=phases,
    )


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


def report(results: Results) -> str:
    rps_digits = 2 if results.engine == "llamacpp" else 0
    rows = [
        [
            f"{'stream' if p.stream else 'whole'}, {p.load.describe()}",
            _pair(p.direct_p50_ms, p.direct_p99_ms),
            _pair(p.gateway_p50_ms, p.gateway_p99_ms),
            _pair(p.added_p50_ms, p.added_p99_ms, "+"),
            _pair(p.added_first_byte_p50_ms, p.added_first_byte_p99_ms, "+"),
            f"{p.direct_rps:,.{rps_digits}f}",
            f"{p.gateway_rps:,.{rps_digits}f}",
            f"{p.p50_ratio:.3f} / {p.p99_ratio:.3f}",
            f"{p.rps_ratio:.3f}",
            _pair(p.gateway_header_p50_ms, p.gateway_header_p99_ms),
            f"{p.gateway_cpu_ms_per_request:.3f}",
            f"{p.cpu_cores_used:.2f}",
            f"{p.load_average[0]:.1f}",
            str(sum(r.direct.errors + r.gateway.errors for r in p.rounds)),
        ]
        for p in results.phases
    ]
    headers = [
        "phase",
        "direct p50/p99 ms",
        "gateway p50/p99 ms",
        "added p50/p99 ms",
        "added 1st byte p50/p99",
        "direct rps",
        "gateway rps",
        "gw/direct p50/p99",
        "gw/direct rps",
        "header ms p50/p99",
        "gw CPU ms/req",
        "cores used",
        "load",
        "errors",
    ]
    return format_table(headers, rows)


def verdict(results: Results) -> list[str]:
    if results.engine == "llamacpp":
        return ratios(results)
    lines = []
    for p in results.phases:
        if p.stream:
            continue
        if p.load.kind == "sequential":
            met = p.added_p50_ms <= TARGET_SEQUENTIAL_P50_MS
            met = met and p.added_p99_ms <= TARGET_SEQUENTIAL_P99_MS
            target = f"p50 <= {TARGET_SEQUENTIAL_P50_MS} ms, p99 <= {TARGET_SEQUENTIAL_P99_MS} ms"
        else:
            # An open loop's rate is what was offered: it is met if the gateway kept up.
            kept_up = p.load.kind == "rate" and p.gateway_rps >= KEPT_UP * p.load.size
            fast_enough = p.gateway_rps >= TARGET_RPS or (kept_up and p.load.size >= TARGET_RPS)
            met = fast_enough and p.added_p99_ms <= TARGET_LOADED_P99_MS
            target = f">= {TARGET_RPS:,.0f}/s with added p99 <= {TARGET_LOADED_P99_MS} ms"
        lines.append(
            f"{p.load.describe()}: {p.gateway_rps:,.0f}/s through the gateway, added p50 "
            f"{p.added_p50_ms:.3f} ms, p99 {p.added_p99_ms:.3f} ms (target {target}): "
            f"{'met' if met else 'not met'}"
        )
    return lines


def ratios(results: Results) -> list[str]:
    """A real engine's run: the targets are the proxy's against an instant engine; here,
    what share of a request's time and of the throughput the gateway costs."""
    lines = []
    for p in results.phases:
        share = p.added_p50_ms / p.gateway_p50_ms
        lines.append(
            f"{'stream' if p.stream else 'whole'}, {p.load.describe()}: through the gateway "
            f"p50 x{p.p50_ratio:.3f} ({p.added_p50_ms:+.1f} ms, {share:.1%} of a request), "
            f"p99 x{p.p99_ratio:.3f}, requests/s x{p.rps_ratio:.3f}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Gateway benchmark (see the module docstring).")
    parser.add_argument("--engine", choices=ENGINES, default="simulator")
    parser.add_argument("--sequential", type=int)
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--rate", type=int, nargs="*")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--no-request-log", action="store_true")
    parser.add_argument("--profile", metavar="DIR")
    parser.add_argument("--workdir", metavar="DIR", help="keep the logs here")
    parser.add_argument("--serve-gateway", metavar="SNAPSHOT", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.serve_gateway:
        serve_gateway(Path(arguments.serve_gateway), arguments.port, not arguments.no_request_log)
        return 0
    for name, value in DEFAULTS[arguments.engine].items():
        if getattr(arguments, name) is None:
            setattr(arguments, name, value)
    if arguments.workdir:
        workdir = Path(arguments.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="llmgw-gateway-bench-"))
    results = uvloop.run(run_all(arguments, workdir))
    print()
    print(report(results))
    print()
    for line in verdict(results):
        print(line)
    path = write_results("gateway", results)
    print(f"\nresults: {path}\nlogs: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
