"""What sharing a key's rate limits across gateways costs a request: sequential latency
through a gateway counting the key's rpm and tpm on its own, and through one leasing
them from PostgreSQL (``app.gateway.sharedlimits``), the same requests, alternating.

    python benchmarks/shared_limits.py [--requests 2000] [--rounds 5]

Two gateway processes (children on uvloop, ``StaticSource`` snapshot with one route and
one key limited to 10^9 requests and tokens a minute, so nothing is refused and what is
measured is the limiter's cost, request log off) in front of one simulator (``--instant``):

* **local**: the gateway's own ``RateLimiter`` (what a gateway does without a database);
* **shared**: ``SharedLimiter`` kept supplied by a ``BudgetKeeper`` on a fresh database
  (``LLMGW_BENCH_DATABASE_URL``, else a throwaway local cluster), as ``llmgw-server
  gateway`` runs it.

Each round sends ``--requests`` requests one after another to each (which goes first
alternates); the figures are the medians over rounds of each round's p50 and p99, of the
client's latency and of the gateway's own ``x-llmgw-gateway-ms``, and the ratio shared /
local of each round, then their median. The load average is recorded. Results go to
``benchmarks/results/shared-limits-<timestamp>.json``; docs/performance.md discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import msgspec
import uvloop

from agent.simulator.launcher import free_port, start_simulator
from app.domain.egress import EngineNetworks
from app.domain.keys import format_key, hash_key
from app.gateway.table import GatewaySnapshot, KeyRecord, Route
from benchmarks.common import (
    bench_server,
    fresh_database,
    load_average,
    median,
    percentile,
    runtime_url,
    stop_on_sigterm,
    write_results,
)

MODEL = "bench-model"
SIM_FLAGS = ("--instant", "--max-num-seqs", "1024", "--num-blocks", "65536")
UNREACHED = 1_000_000_000
START_TIMEOUT_S = 30.0


def serve_gateway(snapshot_path: Path, port: int, database_url: str | None) -> None:
    from app.gateway.budget_keeper import BudgetKeeper
    from app.gateway.server import Gateway, StaticSource
    from app.gateway.sharedlimits import SharedLimiter
    from app.logs import configure_logging

    configure_logging("warning", command="benchmarks/shared_limits.py", json=True)
    snapshot = msgspec.json.decode(snapshot_path.read_bytes(), type=GatewaySnapshot)

    async def run() -> None:
        limiter = SharedLimiter() if database_url else None
        gateway = Gateway(
            StaticSource(snapshot),
            host="127.0.0.1",
            port=port,
            log_requests=False,
            engine_networks=EngineNetworks.parse("127.0.0.0/8"),
            limiter=limiter,
        )
        if limiter is not None and database_url is not None:
            keeper = BudgetKeeper(database_url, limiter, gateway_id="bench")
            limiter.on_ask(keeper.wake)
            await keeper.start()
        await gateway.start()
        await gateway.serve()

    uvloop.run(run())


def start_gateway(
    snapshot_path: Path, port: int, database_url: str | None, log_path: Path
) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--serve-gateway", str(snapshot_path)]
    command += ["--port", str(port)]
    if database_url is not None:
        command += ["--database-url", database_url]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def stop_gateways(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
        process.wait(timeout=10)


class Side(msgspec.Struct, frozen=True, kw_only=True):
    p50_ms: float
    p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float


class Results(msgspec.Struct, frozen=True, kw_only=True):
    requests: int
    rounds: int
    local: list[Side]
    shared: list[Side]
    ratio_p50: float
    ratio_p99: float
    ratio_gateway_p50: float
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]
    refused: int


async def sequential(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], count: int
) -> tuple[Side, int]:
    body = msgspec.json.encode(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    )
    latencies, added = [], []
    refused = 0
    for _ in range(count):
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as answer:
            await answer.read()
            refused += answer.status != 200
            added.append(float(answer.headers.get("x-llmgw-gateway-ms", "nan")))
        latencies.append((time.perf_counter() - started) * 1000)
    side = Side(
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        gateway_p50_ms=percentile(added, 50),
        gateway_p99_ms=percentile(added, 99),
    )
    return side, refused


async def wait_ready(
    session: aiohttp.ClientSession, url: str, process: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"a gateway exited with {process.returncode}")
        try:
            async with session.get(url) as answer:
                if answer.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {START_TIMEOUT_S} s")


async def run(arguments: argparse.Namespace, workdir: Path) -> Results:
    start_load = load_average()
    prefix = uuid.uuid4().hex[:8]
    key = format_key(prefix, uuid.uuid4().hex + uuid.uuid4().hex)
    record = KeyRecord(
        key_id=f"k-{prefix}",
        name="bench",
        prefix=prefix,
        secret_hash=hash_key(key),
        rpm=UNREACHED,
        tpm=UNREACHED,
    )
    with (
        bench_server() as server,
        start_simulator(*SIM_FLAGS, "--model", MODEL, log_path=workdir / "sim.log") as sim,
    ):
        sim.wait_healthy()
        route = Route(
            replica_id=f"{MODEL}-1",
            model=MODEL,
            url=sim.base_url,
            target_waiting=1_000_000,
            kv_ceiling=1.01,
        )
        snapshot = GatewaySnapshot(
            declared=frozenset({MODEL}), routes={MODEL: (route,)}, keys={prefix: record}
        )
        snapshot_path = workdir / "snapshot.json"
        snapshot_path.write_bytes(msgspec.json.encode(snapshot))
        async with fresh_database(server, "llmgw_bench_limits") as url:
            processes: dict[str, subprocess.Popen[bytes]] = {}
            ports: dict[str, int] = {}
            for name, database in (("local", None), ("shared", runtime_url(url))):
                ports[name] = free_port()
                processes[name] = start_gateway(
                    snapshot_path, ports[name], database, workdir / f"{name}.log"
                )
            try:
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
                sides: dict[str, list[Side]] = {"local": [], "shared": []}
                refused = 0
                async with aiohttp.ClientSession() as session:
                    for name, process in processes.items():
                        await wait_ready(session, f"http://127.0.0.1:{ports[name]}/readyz", process)
                    for round_number in range(arguments.rounds + 1):
                        order = ["local", "shared"]
                        if round_number % 2:
                            order.reverse()
                        for name in order:
                            target = f"http://127.0.0.1:{ports[name]}/v1/chat/completions"
                            side, refusals = await sequential(
                                session, target, headers, arguments.requests
                            )
                            if round_number > 0:  # the first round warms both up
                                sides[name].append(side)
                                refused += refusals
            finally:
                stop_gateways(processes.values())

    def ratio(field: str) -> float:
        return median(
            [
                getattr(shared, field) / getattr(local, field)
                for local, shared in zip(sides["local"], sides["shared"], strict=True)
            ]
        )

    return Results(
        requests=arguments.requests,
        rounds=arguments.rounds,
        local=sides["local"],
        shared=sides["shared"],
        ratio_p50=ratio("p50_ms"),
        ratio_p99=ratio("p99_ms"),
        ratio_gateway_p50=ratio("gateway_p50_ms"),
        load_average_start=start_load,
        load_average_end=load_average(),
        refused=refused,
    )


def report(results: Results) -> str:
    lines = [f"{results.requests} sequential requests per side, {results.rounds} rounds"]
    for name, sides in (("local", results.local), ("shared", results.shared)):
        lines.append(
            f"{name:>7}: p50 {median([s.p50_ms for s in sides]):.3f} ms, "
            f"p99 {median([s.p99_ms for s in sides]):.3f} ms; gateway's own p50 "
            f"{median([s.gateway_p50_ms for s in sides]):.3f} ms, p99 "
            f"{median([s.gateway_p99_ms for s in sides]):.3f} ms"
        )
    lines.append(
        f"shared / local: p50 {results.ratio_p50:.3f}, p99 {results.ratio_p99:.3f}, "
        f"gateway's own p50 {results.ratio_gateway_p50:.3f}; refused {results.refused}"
    )
    lines.append(
        f"load average {results.load_average_start[0]:.2f} at the start, "
        f"{results.load_average_end[0]:.2f} at the end"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description="Shared rate limits: added latency.")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve-gateway", metavar="SNAPSHOT", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.serve_gateway:
        serve_gateway(Path(arguments.serve_gateway), arguments.port, arguments.database_url)
        return 0
    if arguments.requests < 1 or arguments.rounds < 1:
        parser.error("--requests and --rounds must be at least 1")
    with tempfile.TemporaryDirectory() as workdir:
        results = asyncio.run(run(arguments, Path(workdir)))
    print(report(results))
    path = write_results("shared-limits", results)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
