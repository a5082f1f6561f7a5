"""The CPU and the time a command of ``llmgw-cli`` and ``llmgw-server`` takes from its spawn
to its exit, side by side with another checkout's.

    python benchmarks/command_start.py [--rounds 15] [--baseline CHECKOUT]

Each command is one an operator or a script runs many times a day, told to reach nothing
(an admin URL and a database on a closed loopback port), so that what is measured is the
program: its imports, its settings, its answer. Rounds alternate between the checkouts
(each with its own ``.venv``), so both see the same machine; the CPU is the child's own,
user and system, from ``wait4``. Medians per command and checkout, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import format_table, load_average, median, write_results

HERE = Path(__file__).resolve().parent
CLOSED = "127.0.0.1:9"
"""A loopback port nothing listens on (discard): every connection is refused at once."""

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("llmgw-cli", "nodes", "--admin-url", f"http://{CLOSED}"),
    ("llmgw-cli", "drain-progress", "d-1", "--admin-url", f"http://{CLOSED}"),
    ("llmgw-cli", "--help"),
    ("llmgw-server", "log", "verify", "--database-url", f"postgresql://llmgw@{CLOSED}/llmgw"),
    ("llmgw-server", "migrate", "--database-url", f"postgresql://llmgw@{CLOSED}/llmgw"),
    ("llmgw-server", "serve", "--help"),
)


class CommandFigures(msgspec.Struct, frozen=True):
    command: str
    checkout: str
    cpu_s_median: float
    wall_s_median: float
    exit_code: int


class Results(msgspec.Struct, frozen=True):
    rounds: int
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]
    figures: list[CommandFigures]


def run_once(checkout: Path, argv: tuple[str, ...]) -> tuple[float, float, int]:
    """CPU seconds, wall seconds and exit code of one run of ``argv`` from ``checkout``."""
    program = checkout / ".venv" / "bin" / argv[0]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    environment["HOME"] = "/nonexistent"  # no CLI config file of the one who runs it
    environment["LLMGW_ADMIN_TOKEN"] = "benchmark"
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(program), *argv[1:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    return usage.ru_utime + usage.ru_stime, wall_s, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    arguments = parser.parse_args()
    checkouts = [HERE.parent.resolve()]
    if arguments.baseline is not None:
        checkouts.insert(0, arguments.baseline.resolve())
    start_load = load_average()
    samples: dict[tuple[str, Path], list[tuple[float, float, int]]] = {}
    for _ in range(arguments.rounds):
        for argv in COMMANDS:
            for checkout in checkouts:
                samples.setdefault((" ".join(argv[:3]), checkout), []).append(
                    run_once(checkout, argv)
                )
    figures = [
        CommandFigures(
            command=command,
            checkout=str(checkout),
            cpu_s_median=round(median([cpu for cpu, _, _ in runs]), 3),
            wall_s_median=round(median([wall for _, wall, _ in runs]), 3),
            exit_code=runs[-1][2],
        )
        for (command, checkout), runs in samples.items()
    ]
    results = Results(arguments.rounds, start_load, load_average(), figures)
    rows = []
    for command in dict.fromkeys(f.command for f in figures):
        of_command = [f for f in figures if f.command == command]
        ratio = (
            f"{of_command[-1].cpu_s_median / of_command[0].cpu_s_median:.2f}"
            if len(of_command) == 2
            else "-"
        )
        for figure in of_command:
            rows.append(
                [
                    command,
                    Path(figure.checkout).name,
                    f"{figure.cpu_s_median:.3f}",
                    f"{figure.wall_s_median:.3f}",
                    str(figure.exit_code),
                    ratio if figure is of_command[-1] else "",
                ]
            )
    headers = ["command", "checkout", "CPU s (median)", "wall s", "exit", "CPU this/base"]
    print(format_table(headers, rows))
    print(f"load average: {start_load} at the start, {results.load_average_end} at the end")
    print(f"written to {write_results('command-start', results)}")


if __name__ == "__main__":
    main()
