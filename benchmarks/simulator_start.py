"""How long the engine simulator takes from its spawn to a ``/health`` that answers 200,
and the CPU it spends on the way, side by side with another checkout's simulator.

    python benchmarks/simulator_start.py [--together 1 4] [--rounds 10]
        [--baseline CHECKOUT]

Each round spawns ``--together`` simulators at once (as a burst's replicas start on one
machine), asks each ``/health`` every 5 ms until it answers 200, and reads the CPU the
process spent until then from ``/proc/PID/stat``. Rounds alternate between the checkouts
(each with its own ``.venv``), so both see the same machine. The simulator stands in for
an engine whose start the agent, the gateway and the autoscaler wait for
(``benchmarks/replica_start.py`` measures the whole of a replica's start: placement to
serving). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def cpu_s(pid: int) -> float:
    """User and system time the process has spent so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def one_round(command: Path, together: int) -> list[tuple[float, float]]:
    """(seconds to serving, CPU seconds by then) of each of ``together`` started at once."""
    ports = [free_port() for _ in range(together)]
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [str(command), "--port", str(port), "--model", "probe"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    figures: dict[int, tuple[float, float]] = {}
    try:
        deadline = started + 60
        while len(figures) < together:
            if time.perf_counter() > deadline:
                raise SystemExit(f"{command} did not serve within 60 s")
            for port, process in zip(ports, processes, strict=True):
                if port not in figures and healthy(port):
                    figures[port] = (time.perf_counter() - started, cpu_s(process.pid))
            time.sleep(0.005)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
    return list(figures.values())


def describe(figures: list[tuple[float, float]]) -> str:
    walls = sorted(wall for wall, _ in figures)
    cpus = [cpu for _, cpu in figures]
    p90 = walls[min(len(walls) - 1, int(len(walls) * 0.9))]
    return (
        f"{len(figures)} starts: serving after a median {1000 * statistics.median(walls):.0f} ms"
        f" (p90 {1000 * p90:.0f}), CPU a median {1000 * statistics.median(cpus):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--together", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    arguments = parser.parse_args()
    if arguments.rounds < 1 or not all(1 <= n <= 32 for n in arguments.together):
        parser.error("--rounds must be at least 1, --together 1 to 32")
    checkouts = [HERE.parent]
    if arguments.baseline is not None:
        checkouts.insert(0, arguments.baseline.resolve())
    commands = {c: c / ".venv" / "bin" / "llmgw-sim-engine" for c in checkouts}
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    for together in arguments.together:
        every: dict[Path, list[tuple[float, float]]] = {c: [] for c in checkouts}
        for _ in range(arguments.rounds):
            for checkout in checkouts:
                every[checkout] += one_round(commands[checkout], together)
        for checkout, figures in every.items():
            print(f"{together} at once, {checkout}: {describe(figures)}", flush=True)
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
