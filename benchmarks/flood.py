"""Flood: what one node connection sending as fast as it can costs everyone else.

    python benchmarks/flood.py [--seconds 10] [--rounds 3] [--workdir DIR]

The cluster is the one the end-to-end tests run (``tests/support/cluster.py``) on a fresh
database: one ``llmgw-server serve`` with its embedded gateway (the hub, the gateway and
the admin API share one process and one event loop), two honest ``llmgw-agent`` with a
model of two replicas of the instant engine simulator, and heartbeats every second.

For each variant, ``--rounds`` rounds of two phases of ``--seconds`` each, measured the same
way, quiet and flood in turn so that the machine's other load hits both alike:

- **quiet**: a client sends chat completions one after another through the gateway, and
  another asks the admin API's ``/readyz`` every 20 ms; their latencies are kept;
- **flood**: the same, while a flooder in a process of its own (started, and its imports
  done, before the first round), holding a valid node certificate, says hello and then
  sends heartbeats as fast as its socket takes them.

Variants: the agent message budget switched off (``--agent-message-rate 1e9``, as the hub
was before it had one), the default budget with a flooder that gives up when cut off, and
the default budget with a flooder that reconnects at once every time. Reported per
variant: gateway and ``/readyz`` p50 and p99 in each phase (medians over the rounds) and
their flood/quiet ratios (goal: at most 2x), whether an honest agent was disconnected
during the flood, what the flooder sent, and the events appended. Results go to
``benchmarks/results/flood-<timestamp>.json``; ``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import msgspec

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from benchmarks.common import (
    bench_server,
    format_table,
    fresh_database,
    load_average,
    median,
    percentile,
    stop_on_sigterm,
    write_results,
)
from tests.support.cluster import Cluster, LoggedEvent, ServerProcess, ServerSettings, issue_pki
from tests.support.databases import TEST_RUNTIME_ROLE

HONEST = ("gpu-a", "gpu-b")
FLOODER = "gpu-flood"
MODEL = "sim"
READYZ_EVERY_S = 0.02
NO_BUDGET = ("--agent-message-rate", "1e9", "--agent-message-burst", "1000000000")


class Variant(msgspec.Struct, frozen=True):
    name: str
    server_flags: tuple[str, ...]
    flooder_reconnects: bool


VARIANTS = (
    Variant("no budget (as before)", NO_BUDGET, flooder_reconnects=False),
    Variant("budget, flooder gives up", (), flooder_reconnects=False),
    Variant("budget, flooder reconnects", (), flooder_reconnects=True),
)


class Latencies(msgspec.Struct, frozen=True, kw_only=True):
    gateway_ms: list[float]
    readyz_ms: list[float]
    gateway_failures: int
    readyz_failures: int


class FlooderReport(msgspec.Struct, frozen=True, kw_only=True):
    messages: int
    connections: int
    cut_off: int


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    gateway_p50_ms: float
    gateway_p99_ms: float
    readyz_p50_ms: float
    readyz_p99_ms: float
    gateway_requests: int
    failures: int


class VariantResult(msgspec.Struct, frozen=True, kw_only=True):
    variant: str
    quiet: Phase
    flood: Phase
    gateway_p99_ratio: float
    readyz_p99_ratio: float
    honest_disconnects: int
    flooder: FlooderReport
    events_during_flood: dict[str, int]


class Results(msgspec.Struct, frozen=True, kw_only=True):
    seconds: float
    rounds: int
    load_average: tuple[float, float, float]
    variants: list[VariantResult]


# -- the flooder (a process of its own) --------------------------------------------------


def flooder_main(uri: str, ca: str, certificate: str, key: str, seconds: float, again: bool) -> int:
    """Say ready, then flood for ``seconds`` each time a line arrives on stdin, answering
    each with a report line; end at EOF."""
    print("ready", flush=True)
    while sys.stdin.readline():
        report = asyncio.run(flood(uri, ca, certificate, key, seconds, again))
        print(msgspec.json.encode(report).decode(), flush=True)
    return 0


async def flood(
    uri: str, ca: str, certificate: str, key: str, seconds: float, again: bool
) -> FlooderReport:
    from wire.messages import PROTOCOL_VERSION, Heartbeat, Hello, encode

    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(certificate, key)
    hello = encode(
        Hello(
            protocol_version=PROTOCOL_VERSION,
            node_id=FLOODER,
            agent_version="flooder",
            address="127.0.0.1",
            port_range=(40000, 40099),
        )
    )
    deadline = time.monotonic() + seconds
    messages = connections = cut_off = 0
    while time.monotonic() < deadline:
        connections += 1
        try:
            async with connect(uri, ssl=context, max_queue=None) as websocket:
                await websocket.send(hello, text=True)
                seq = 0
                while time.monotonic() < deadline:
                    seq += 1
                    await websocket.send(encode(Heartbeat(seq=seq)), text=True)
                    messages += 1
                    if seq % 50 == 0:
                        await asyncio.sleep(0)
        except (ConnectionClosed, WebSocketException, OSError):
            cut_off += 1
        if not again:
            break
    return FlooderReport(messages=messages, connections=connections, cut_off=cut_off)


# -- measuring ---------------------------------------------------------------------------


async def measure(server: ServerProcess, key: str, seconds: float) -> Latencies:
    gateway_ms: list[float] = []
    readyz_ms: list[float] = []
    failures = {"gateway": 0, "readyz": 0}
    deadline = time.monotonic() + seconds
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def chat(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                answer = await client.post(
                    f"{server.gateway_url}/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {key}"},
                )
                ok = answer.status_code == 200
            except httpx.HTTPError:
                ok = False
            gateway_ms.append((time.perf_counter() - started) * 1000)
            failures["gateway"] += not ok

    async def readyz(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                ok = (await client.get(f"{server.admin_url}/readyz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            readyz_ms.append((time.perf_counter() - started) * 1000)
            failures["readyz"] += not ok
            await asyncio.sleep(READYZ_EVERY_S)

    async with httpx.AsyncClient(timeout=30.0) as client:
        await asyncio.gather(chat(client), readyz(client))
    return Latencies(
        gateway_ms=gateway_ms,
        readyz_ms=readyz_ms,
        gateway_failures=failures["gateway"],
        readyz_failures=failures["readyz"],
    )


def phase(latencies: Latencies) -> Phase:
    return Phase(
        gateway_p50_ms=round(percentile(latencies.gateway_ms, 50), 2),
        gateway_p99_ms=round(percentile(latencies.gateway_ms, 99), 2),
        readyz_p50_ms=round(percentile(latencies.readyz_ms, 50), 2),
        readyz_p99_ms=round(percentile(latencies.readyz_ms, 99), 2),
        gateway_requests=len(latencies.gateway_ms),
        failures=latencies.gateway_failures + latencies.readyz_failures,
    )


async def run_variant(
    variant: Variant, database_url: str, workdir: Path, seconds: float, rounds: int
) -> VariantResult:
    (workdir / "pki").mkdir(parents=True)
    (workdir / "cluster").mkdir()
    pki = issue_pki(workdir / "pki", (*HONEST, FLOODER))
    settings = ServerSettings(heartbeat_interval_s=1.0, extra_flags=variant.server_flags)
    async with Cluster(database_url, workdir / "cluster", pki, settings=settings) as cluster:
        server = cluster.start_server()
        await cluster.wait_for_leader()
        await cluster.start_fleet(HONEST, MODEL, replicas=2)
        key = await cluster.create_key("flood", [MODEL])
        credentials = pki.node(FLOODER)
        flooder = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--flooder",
            server.agent_uri,
            str(credentials.ca),
            str(credentials.certificate),
            str(credentials.key),
            str(seconds),
            "1" if variant.flooder_reconnects else "0",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert flooder.stdin is not None
        assert flooder.stdout is not None
        assert (await flooder.stdout.readline()).strip() == b"ready"
        await measure(server, key, 2.0)  # warm-up: connections, the routing table
        quiet: list[Phase] = []
        flooded: list[Phase] = []
        reports: list[FlooderReport] = []
        events: list[LoggedEvent] = []
        for _ in range(rounds):
            quiet.append(phase(await measure(server, key, seconds)))
            mark = await cluster.last_position()
            flooder.stdin.write(b"go\n")
            flooded.append(phase(await measure(server, key, seconds)))
            line = await flooder.stdout.readline()
            reports.append(msgspec.json.decode(line, type=FlooderReport))
            events += await cluster.events(after=mark)
        flooder.stdin.close()
        await flooder.wait()
    counts: dict[str, int] = {}
    for event in events:
        counts[event.type] = counts.get(event.type, 0) + 1
    honest_disconnects = sum(
        1 for e in events if e.type == "node_disconnected" and e.get("node_id") in HONEST
    )
    quiet_phase, flood_phase = median_phase(quiet), median_phase(flooded)
    return VariantResult(
        variant=variant.name,
        quiet=quiet_phase,
        flood=flood_phase,
        gateway_p99_ratio=round(flood_phase.gateway_p99_ms / quiet_phase.gateway_p99_ms, 2),
        readyz_p99_ratio=round(flood_phase.readyz_p99_ms / quiet_phase.readyz_p99_ms, 2),
        honest_disconnects=honest_disconnects,
        flooder=FlooderReport(
            messages=sum(r.messages for r in reports),
            connections=sum(r.connections for r in reports),
            cut_off=sum(r.cut_off for r in reports),
        ),
        events_during_flood=counts,
    )


def median_phase(phases: Sequence[Phase]) -> Phase:
    return Phase(
        gateway_p50_ms=round(median([p.gateway_p50_ms for p in phases]), 2),
        gateway_p99_ms=round(median([p.gateway_p99_ms for p in phases]), 2),
        readyz_p50_ms=round(median([p.readyz_p50_ms for p in phases]), 2),
        readyz_p99_ms=round(median([p.readyz_p99_ms for p in phases]), 2),
        gateway_requests=sum(p.gateway_requests for p in phases),
        failures=sum(p.failures for p in phases),
    )


async def run_all(arguments: argparse.Namespace, workdir: Path) -> Results:
    results: list[VariantResult] = []
    with bench_server() as server:
        for number, variant in enumerate(VARIANTS):
            async with fresh_database(server, "llmgw_flood", TEST_RUNTIME_ROLE) as url:
                result = await run_variant(
                    variant, url, workdir / str(number), arguments.seconds, arguments.rounds
                )
            print(_one_line(result), flush=True)
            results.append(result)
    return Results(
        seconds=arguments.seconds,
        rounds=arguments.rounds,
        load_average=load_average(),
        variants=results,
    )


def _one_line(result: VariantResult) -> str:
    return (
        f"{result.variant}: gateway p99 {result.quiet.gateway_p99_ms} -> "
        f"{result.flood.gateway_p99_ms} ms ({result.gateway_p99_ratio}x), readyz p99 "
        f"{result.quiet.readyz_p99_ms} -> {result.flood.readyz_p99_ms} ms "
        f"({result.readyz_p99_ratio}x), honest disconnects {result.honest_disconnects}, "
        f"flooder sent {result.flooder.messages} in {result.flooder.connections} connection(s)"
    )


def report(results: Results) -> str:
    headers = (
        "variant",
        "gw p50 quiet/flood",
        "gw p99 quiet/flood",
        "gw p99 x",
        "readyz p99 quiet/flood",
        "readyz x",
        "honest cut",
        "flood msgs",
        "events",
    )
    rows = [
        (
            r.variant,
            f"{r.quiet.gateway_p50_ms}/{r.flood.gateway_p50_ms}",
            f"{r.quiet.gateway_p99_ms}/{r.flood.gateway_p99_ms}",
            f"{r.gateway_p99_ratio}",
            f"{r.quiet.readyz_p99_ms}/{r.flood.readyz_p99_ms}",
            f"{r.readyz_p99_ratio}",
            str(r.honest_disconnects),
            str(r.flooder.messages),
            str(sum(r.events_during_flood.values())),
        )
        for r in results.variants
    ]
    return format_table(headers, rows)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3, help="quiet and flood phases per variant")
    parser.add_argument("--workdir", type=Path, help="keep certificates and logs here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--flooder"]:
        uri, ca, certificate, key, seconds, again = given[1:7]
        return flooder_main(uri, ca, certificate, key, float(seconds), again == "1")
    arguments = parse_arguments(given)
    with contextlib.ExitStack() as stack:
        workdir = arguments.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        results = asyncio.run(run_all(arguments, workdir))
    print(report(results))
    print(f"results: {write_results('flood', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
