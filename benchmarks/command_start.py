"""The CPU and the time a command of ``llmgw-cli`` and ``llmgw-server`` takes from its spawn
to its exit, side by side with another checkout's, or with and without cached bytecode.

    python benchmarks/command_start.py [--rounds 15] [--baseline CHECKOUT]
    python benchmarks/command_start.py --bytecode compare

Each command is one an operator or a script runs many times a day, told to reach nothing
(an admin URL and a database on a closed loopback port), so that what is measured is the
program: its imports, its settings, its answer. Rounds alternate between the variants (each
checkout with its own ``.venv``), so both see the same machine; the CPU is the child's own,
user and system, from ``wait4``. Medians per command and variant, and their ratio.

``--bytecode`` says what each run finds of llmgw's own compiled modules (the installed
packages' are compiled at install either way): ``tree`` (the default) whatever the
checkout's ``__pycache__`` folders hold; ``none`` and ``cached`` a copy of its packages,
never compiled (run with ``PYTHONDONTWRITEBYTECODE=1``) or compiled beforehand;
``compare`` this checkout alone, ``none`` against ``cached``.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
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


PACKAGES = ("app", "agent", "cli", "wire", "devcluster")
"""llmgw's own packages: what ``--bytecode none`` and ``cached`` copy."""


class CommandFigures(msgspec.Struct, frozen=True):
    command: str
    variant: str
    cpu_s_median: float
    wall_s_median: float
    exit_code: int


class Results(msgspec.Struct, frozen=True):
    rounds: int
    bytecode: str
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]
    figures: list[CommandFigures]


@dataclass(frozen=True)
class Variant:
    """One way of running the commands: a checkout's programs, and where they import
    llmgw's packages from (the checkout's own tree when ``packages`` is None)."""

    name: str
    checkout: Path
    packages: Path | None = None
    write_bytecode: bool = True

    def environment(self) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        environment["HOME"] = "/nonexistent"  # no CLI config file of the one who runs it
        environment["LLMGW_ADMIN_TOKEN"] = "benchmark"
        if self.packages is not None:
            # Found before the editable install's finder, which comes last on sys.meta_path.
            environment["PYTHONPATH"] = str(self.packages)
            environment["PYTHONDONTWRITEBYTECODE"] = "" if self.write_bytecode else "1"
        return environment


@contextmanager
def copied_packages(checkout: Path, *, compiled: bool) -> Iterator[Path]:
    """llmgw's packages of ``checkout`` in a folder of their own, without bytecode, or
    compiled when ``compiled``."""
    with tempfile.TemporaryDirectory(prefix="llmgw-bytecode-") as folder:
        for package in PACKAGES:
            shutil.copytree(
                checkout / package,
                Path(folder) / package,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        if compiled:
            compileall.compile_dir(folder, quiet=1)
        yield Path(folder)


def variants(stack: ExitStack, bytecode: str, checkouts: list[Path]) -> list[Variant]:
    if bytecode == "compare":
        this = checkouts[-1]
        never = stack.enter_context(copied_packages(this, compiled=False))
        built = stack.enter_context(copied_packages(this, compiled=True))
        return [
            Variant("none", this, never, write_bytecode=False),
            Variant("cached", this, built),
        ]
    if bytecode == "tree":
        return [Variant(checkout.name, checkout) for checkout in checkouts]
    compiled = bytecode == "cached"
    return [
        Variant(
            checkout.name,
            checkout,
            stack.enter_context(copied_packages(checkout, compiled=compiled)),
            write_bytecode=compiled,
        )
        for checkout in checkouts
    ]


def run_once(variant: Variant, argv: tuple[str, ...]) -> tuple[float, float, int]:
    """CPU seconds, wall seconds and exit code of one run of ``argv`` as ``variant``."""
    program = variant.checkout / ".venv" / "bin" / argv[0]
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(program), *argv[1:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=variant.environment(),
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    return usage.ru_utime + usage.ru_stime, wall_s, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    parser.add_argument("--bytecode", choices=("tree", "none", "cached", "compare"), default="tree")
    arguments = parser.parse_args()
    checkouts = [HERE.parent.resolve()]
    if arguments.baseline is not None:
        checkouts.insert(0, arguments.baseline.resolve())
    start_load = load_average()
    samples: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    with ExitStack() as stack:
        runs_as = variants(stack, arguments.bytecode, checkouts)
        for _ in range(arguments.rounds):
            for argv in COMMANDS:
                for variant in runs_as:
                    samples.setdefault((" ".join(argv[:3]), variant.name), []).append(
                        run_once(variant, argv)
                    )
    figures = [
        CommandFigures(
            command=command,
            variant=variant,
            cpu_s_median=round(median([cpu for cpu, _, _ in runs]), 3),
            wall_s_median=round(median([wall for _, wall, _ in runs]), 3),
            exit_code=runs[-1][2],
        )
        for (command, variant), runs in samples.items()
    ]
    results = Results(arguments.rounds, arguments.bytecode, start_load, load_average(), figures)
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
                    figure.variant,
                    f"{figure.cpu_s_median:.3f}",
                    f"{figure.wall_s_median:.3f}",
                    str(figure.exit_code),
                    ratio if figure is of_command[-1] else "",
                ]
            )
    headers = ["command", "variant", "CPU s (median)", "wall s", "exit", "CPU 2nd/1st"]
    print(format_table(headers, rows))
    print(f"load average: {start_load} at the start, {results.load_average_end} at the end")
    print(f"written to {write_results('command-start', results)}")


if __name__ == "__main__":
    main()
