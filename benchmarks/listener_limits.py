"""What the listener limits (``app.listeners.limits``) cost a request, side by side with none.

    python benchmarks/listener_limits.py [--requests 5000] [--rounds 5]

One process, one uvloop loop, two uvicorn servers on loopback running the same trivial ASGI
app (it reads the body and answers 200): one with uvicorn's httptools protocol as it is,
one with ``limited(...)`` around it at the default limits (a header and a body timer per
request, the head's bytes counted). One client on one kept-alive connection per server
sends ``--requests`` small JSON POSTs one after another and times each round trip. Rounds
alternate which server goes first; the figures are the medians of the rounds' p50 and p99,
and the difference is what the limits add. Everything else a gateway does is left out, so
the difference is not drowned in it (``benchmarks/gateway.py`` measures the whole
gateway).

Results are printed and written to ``benchmarks/results/listener-limits-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.listeners.limits import ListenerLimits, limited
from benchmarks.common import format_table, load_average, median, percentile, write_results

BODY = b'{"model": "bench-model", "messages": [{"role": "user", "content": "Hello!"}]}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"Authorization: Bearer llmgw-00000000-xxxxxxxxxxxxxxxxxxxx\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"3")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok\n"})


class Target(msgspec.Struct, frozen=True):
    name: str
    p50_ms: float
    p99_ms: float
    requests_per_s: float


class Results(msgspec.Struct, frozen=True):
    requests: int
    rounds: int
    targets: list[Target]
    added_p50_ms: float
    added_p99_ms: float
    load_average: tuple[float, float, float]


async def serve(protocol: type[HttpToolsProtocol]) -> tuple[uvicorn.Server, int]:
    listener = socket.socket()
    # As the gateway binds its listener: without it, a small answer waits on delayed ACKs.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=protocol, lifespan="off", access_log=False, log_config=None, ws="none"
    )
    server = uvicorn.Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[listener]))
    while not server.started:
        if serving.done():
            raise RuntimeError(f"{protocol.__name__} did not start") from serving.exception()
        await asyncio.sleep(0.01)
    return server, listener.getsockname()[1]


async def round_trips(port: int, requests: int) -> list[float]:
    """Seconds of each request's round trip, one after another on one connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    try:
        for _ in range(requests):
            started = time.perf_counter()
            writer.write(REQUEST)
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(3)
            times.append(time.perf_counter() - started)
    finally:
        writer.close()
    return times


async def run(requests: int, rounds: int) -> Results:
    protocols: dict[str, type[HttpToolsProtocol]] = {
        "httptools": HttpToolsProtocol,
        "limited": limited(HttpToolsProtocol, ListenerLimits()),
    }
    servers = {name: await serve(protocol) for name, protocol in protocols.items()}
    samples: dict[str, list[list[float]]] = {name: [] for name in servers}
    for number in range(rounds):
        order = list(servers) if number % 2 == 0 else list(reversed(servers))
        for name in order:
            await round_trips(servers[name][1], requests // 10)  # warm up
            samples[name].append(await round_trips(servers[name][1], requests))
    for server, _ in servers.values():
        server.should_exit = True
    targets = [
        Target(
            name=name,
            p50_ms=median([percentile(r, 50) * 1000 for r in rounds_of]),
            p99_ms=median([percentile(r, 99) * 1000 for r in rounds_of]),
            requests_per_s=median([len(r) / sum(r) for r in rounds_of]),
        )
        for name, rounds_of in samples.items()
    ]
    plain, limits = targets
    return Results(
        requests=requests,
        rounds=rounds,
        targets=targets,
        added_p50_ms=limits.p50_ms - plain.p50_ms,
        added_p99_ms=limits.p99_ms - plain.p99_ms,
        load_average=load_average(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Listener limits benchmark (see the docstring).")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args(argv)
    results = uvloop.run(run(arguments.requests, arguments.rounds))
    rows = [
        [t.name, f"{t.p50_ms:.3f}", f"{t.p99_ms:.3f}", f"{t.requests_per_s:,.0f}"]
        for t in results.targets
    ]
    print(format_table(["protocol", "p50 ms", "p99 ms", "requests/s"], rows))
    print(
        f"the limits add p50 {results.added_p50_ms:+.3f} ms, p99 {results.added_p99_ms:+.3f} ms"
        f" (load average {results.load_average[0]:.2f})"
    )
    print(f"results: {write_results('listener-limits', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
