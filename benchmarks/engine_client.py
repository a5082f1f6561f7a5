"""The gateway's engine client alone: the CPU it spends per request against an instant
simulator, side by side with another checkout's engine client.

    python benchmarks/engine_client.py [--requests 10000] [--concurrency 10]
        [--rounds 6] [--stream] [--baseline CHECKOUT]

One simulator (``--instant``, so it answers as fast as it can) serves every round. A
round is a process of the checkout's own interpreter that sends ``--requests`` chat
completions over ``--concurrency`` kept-alive connections (``app.gateway.engine_client``,
on uvloop, as the gateway runs it) after 300 to warm up, and reports the CPU it spent per
request: the client's parsing, pooling and bookkeeping, without the gateway's routing,
keys or metrics (``benchmarks/gateway.py`` measures the whole gateway, with more noise).
Rounds alternate between the checkouts, so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = "probe"

ROUND = """
import asyncio, json, resource, sys, time
import uvloop
from app.gateway.engine_client import EngineClient

port, requests, concurrency, stream = (int(a) for a in sys.argv[1:5])
body = json.dumps({"model": "probe", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 16, "stream": bool(stream)}).encode()

async def one(client, number):
    answer = await client.post(f"http://127.0.0.1:{port}", "/v1/chat/completions", body,
                               f"r{number}")
    if stream:
        async for _ in answer.chunks():
            pass
    else:
        await answer.read()

async def main():
    client = EngineClient()
    for number in range(300):
        await one(client, number)
    before = resource.getrusage(resource.RUSAGE_SELF)
    async def worker():
        for number in range(requests // concurrency):
            await one(client, number)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    after = resource.getrusage(resource.RUSAGE_SELF)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps(spent / (requests // concurrency * concurrency)))

uvloop.run(main())
"""


def one_round(checkout: Path, port: int, arguments: argparse.Namespace) -> float:
    """CPU seconds per request of one round in ``checkout``."""
    completed = subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            "-c",
            ROUND,
            str(port),
            str(arguments.requests),
            str(arguments.concurrency),
            str(int(arguments.stream)),
        ],
        cwd=checkout,
        env=os.environ | {"PYTHONPATH": str(checkout)},
        check=True,
        capture_output=True,
        text=True,
    )
    spent: float = json.loads(completed.stdout.strip().splitlines()[-1])
    return spent


def main() -> None:
    sys.path.insert(0, str(HERE.parent))
    from agent.simulator.launcher import start_simulator

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--stream", action="store_true", help="streamed answers")
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    arguments = parser.parse_args()
    if min(arguments.requests, arguments.concurrency, arguments.rounds) < 1:
        parser.error("--requests, --concurrency and --rounds must be at least 1")
    checkouts = [HERE.parent]
    if arguments.baseline is not None:
        checkouts.insert(0, arguments.baseline.resolve())
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    spent: dict[Path, list[float]] = {c: [] for c in checkouts}
    with start_simulator("--model", MODEL, "--instant", "--max-num-seqs", "1024") as simulator:
        simulator.wait_healthy()
        for _ in range(arguments.rounds):
            for checkout in checkouts:
                spent[checkout].append(one_round(checkout, simulator.port, arguments))
    for checkout, figures in spent.items():
        micro = sorted(1e6 * figure for figure in figures)
        print(
            f"{checkout}: CPU per request a median {statistics.median(micro):.1f} us "
            f"(best {micro[0]:.1f}, worst {micro[-1]:.1f}; {len(micro)} rounds)"
        )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
