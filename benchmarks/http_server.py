"""The listeners' HTTP server alone against uvicorn's httptools protocol, on a trivial ASGI
app: what each costs per request, with no gateway behind it.

    python benchmarks/http_server.py                         # 5 rounds of 5 s, 50 connections
    python benchmarks/http_server.py --rounds 3 --seconds 2  # to try it out

Each server runs in a child process of its own on uvloop (``--serve lean|uvicorn``),
serving the same app: it reads a small JSON body and answers a small JSON one, with its
length (a whole answer, as the gateway's to a completion). uvicorn is set up as the
gateway had it (``HttpToolsProtocol``, no access log, no lifespan, no server header).
The load is wrk with ``--connections`` connections (``benchmarks/wrk_post.lua``: POST
the body, figures as JSON). The rounds interleave the two servers, their order swapped
each round, so a change in the machine's load falls on both; a server's figure is the
median of its rounds: CPU per request (``/proc/<pid>/stat``, user + system), requests
per second, and the ratio of the two servers' CPU in the same round.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.listeners.exchange import Receive, Scope, Send
from benchmarks.common import format_table, load_average, median, write_results
from benchmarks.routers import tree_cpu_s
from benchmarks.wrk import ensure_wrk, run_wrk

SERVERS = ("lean", "uvicorn")
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
ANSWER = b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0}]}'
START_TIMEOUT_S = 20.0


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the request's body, answers ``ANSWER`` whole."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def serve(server: str, port: int) -> None:
    """The child process: ``server`` on ``port`` until killed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))

    async def lean() -> None:
        from app.listeners.heap import settle_heap
        from app.listeners.httpserver import HttpServer
        from app.listeners.limits import ListenerLimits

        server = HttpServer(
            app, limits=ListenerLimits(max_connections=4096), idle_s=75, graceful_shutdown_s=1,
            lifespan=False,
        )  # fmt: skip
        await server.start(sock)
        settle_heap()
        await server.serve()

    async def with_uvicorn() -> None:
        import uvicorn
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        config = uvicorn.Config(
            app,
            http=HttpToolsProtocol,
            ws="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            timeout_keep_alive=75,
        )
        await uvicorn.Server(config).serve(sockets=[sock])

    uvloop.run(lean() if server == "lean" else with_uvicorn())


class Side(msgspec.Struct, frozen=True):
    server: str
    requests: int
    errors: int
    seconds: float
    cpu_s: float
    us_per_request: float
    rps: float
    p50_ms: float
    p99_ms: float


class Results(msgspec.Struct, frozen=True, kw_only=True):
    started_at: str
    connections: int
    seconds: float
    rounds: list[list[Side]]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    lean_us: float
    uvicorn_us: float
    ratio: float
    """Median over rounds of the lean server's CPU per request over uvicorn's."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(server: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    log = (workdir / f"{server}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", server, "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{server} did not start: see {workdir}") from None
            time.sleep(0.05)


def run(arguments: argparse.Namespace) -> Results:
    wrk = ensure_wrk()
    if wrk is None:
        raise SystemExit("wrk is needed: apt-get install -y wrk")
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-http-server-bench-"))
    body = workdir / "body.json"
    body.write_bytes(BODY)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = load_average()
    servers = {name: _start(name, workdir) for name in SERVERS}
    rounds: list[list[Side]] = []
    try:
        for _, port in servers.values():  # warm-up, not counted
            run_wrk(wrk, f"http://127.0.0.1:{port}/", {}, body, arguments.connections, 1, 1)
        for number in range(arguments.rounds):
            order = SERVERS if number % 2 == 0 else SERVERS[::-1]
            sides = []
            for name in order:
                process, port = servers[name]
                before = tree_cpu_s(process.pid)
                result = run_wrk(
                    wrk,
                    f"http://127.0.0.1:{port}/",
                    {"Content-Type": "application/json"},
                    body,
                    arguments.connections,
                    arguments.seconds,
                    1,
                )
                cpu_s = tree_cpu_s(process.pid) - before
                sides.append(
                    Side(
                        server=name,
                        requests=result.requests,
                        errors=result.errors,
                        seconds=result.seconds,
                        cpu_s=cpu_s,
                        us_per_request=cpu_s / max(1, result.requests) * 1e6,
                        rps=result.requests / result.seconds,
                        p50_ms=result.p50_ms,
                        p99_ms=result.p99_ms,
                    )
                )
                print(f"round {number + 1} {name}: {_line(sides[-1])}", flush=True)
            rounds.append(sorted(sides, key=lambda s: SERVERS.index(s.server)))
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=10)
    us = {name: median([r[i].us_per_request for r in rounds]) for i, name in enumerate(SERVERS)}
    return Results(
        started_at=started_at,
        connections=arguments.connections,
        seconds=arguments.seconds,
        rounds=rounds,
        load_before=load_before,
        load_after=load_average(),
        lean_us=us["lean"],
        uvicorn_us=us["uvicorn"],
        ratio=median([r[0].us_per_request / r[1].us_per_request for r in rounds]),
    )


def _line(side: Side) -> str:
    return (
        f"{side.us_per_request:.1f} us CPU/request, {side.rps:,.0f} req/s, "
        f"p50 {side.p50_ms:.2f} ms, p99 {side.p99_ms:.2f} ms, {side.errors} errors"
    )


def report(results: Results) -> str:
    rows = []
    for i, name in enumerate(SERVERS):
        sides = [r[i] for r in results.rounds]
        rows.append(
            [
                name,
                f"{median([s.us_per_request for s in sides]):.1f}",
                f"{median([s.rps for s in sides]):,.0f}",
                f"{median([s.p50_ms for s in sides]):.2f}",
                f"{median([s.p99_ms for s in sides]):.2f}",
                str(sum(s.errors for s in sides)),
            ]
        )
    table = format_table(["server", "CPU us/request", "req/s", "p50 ms", "p99 ms", "errors"], rows)
    return (
        f"{table}\n\nlean / uvicorn CPU per request, median of the rounds' ratios: "
        f"{results.ratio:.2f}x; load average {results.load_before} before, "
        f"{results.load_after} after"
    )


def main(argv: Sequence[str] | None = None) -> int:
    described = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    described.add_argument("--rounds", type=int, default=5)
    described.add_argument("--seconds", type=float, default=5.0)
    described.add_argument("--connections", type=int, default=50)
    described.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    described.add_argument("--port", type=int, help=argparse.SUPPRESS)
    arguments = described.parse_args(argv)
    if arguments.serve:
        serve(arguments.serve, arguments.port)
        return 0
    os.environ.setdefault("PYTHONHASHSEED", "0")
    results = run(arguments)
    print()
    print(report(results))
    print(f"\nresults: {write_results('http_server', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
