"""How many files and functions a reader follows along a drain and along a reconnect.

    python benchmarks/codepaths.py                      # this checkout
    python benchmarks/codepaths.py --checkout ../base    # another one, with its own .venv

It runs ``benchmarks/codepaths_scenario.py`` (a drain through ``llmgw-cli drain --wait``,
then an agent killed and started again) on real processes of the checkout, every one of
them loading ``benchmarks/codepaths_site/sitecustomize.py``. That records, at each point
where a process acts on another (an event appended, a WebSocket frame other than a
heartbeat, the CLI's HTTP request, an engine spawned or signalled), the project's frames on
the stack. A phase's path is the union of those chains in its time window: the files and
functions from the entry point (the CLI command, the agent's connect loop, the hub's
receive loop, the reconciler's tick) to each effect. The engine simulator is left out: it
is the engine, not llmgw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIO_NAME = "_codepaths_scenario.py"
LEFT_OUT = ("agent/simulator/",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=HERE.parent)
    parser.add_argument("--keep", type=Path, help="keep the raw records in this directory")
    parser.add_argument(
        "--list",
        action="store_true",
        help="print every file and function; * marks those on the chains",
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="runs of the scenario; a path is their union"
    )
    arguments = parser.parse_args()
    checkout = arguments.checkout.resolve()
    records = Path(arguments.keep or tempfile.mkdtemp(prefix="codepaths-"))
    runs = [records / f"run-{number}" for number in range(1, arguments.runs + 1)]
    for run in runs:
        run.mkdir(parents=True, exist_ok=True)
        trace(checkout, run)
    report(checkout, runs, listing=arguments.list)


def trace(checkout: Path, records: Path) -> None:
    scenario = checkout / "tests" / "e2e" / SCENARIO_NAME
    shutil.copyfile(HERE / "codepaths_scenario.py", scenario)
    environment = os.environ | {
        "CODEPATHS_DIR": str(records),
        "CODEPATHS_ROOT": str(checkout),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "codepaths_site"), str(checkout), os.environ.get("PYTHONPATH", "")]
        ),
    }
    try:
        subprocess.run(
            [
                str(checkout / ".venv" / "bin" / "python"),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                str(scenario),
            ],
            cwd=checkout,
            env=environment,
            check=True,
        )
    finally:
        scenario.unlink(missing_ok=True)


Frame = tuple[str, str]
"""A function: its file, relative to the checkout, and its qualified name."""


def report(checkout: Path, runs: list[Path], *, listing: bool) -> None:
    paths: dict[str, PhasePath] = defaultdict(PhasePath)
    for run in runs:
        for phase, path in phase_paths(run).items():
            paths[phase].update(path)
    print(f"checkout {checkout} ({_commit(checkout)}), the union of {len(runs)} runs")
    for phase in sorted(paths):
        path = paths[phase]
        functions = {f for f in path.functions if not f[0].startswith(LEFT_OUT)}
        files = {file for file, _ in functions}
        chain_files = {file for file, _ in path.on_chain}
        print(
            f"{phase:10} {len(files):3} files {len(functions):4} functions "
            f"(on the chains alone {len(chain_files)} files {len(path.on_chain)} functions); "
            + ", ".join(
                f"{program} {len(f)}" for program, f in sorted(path.files_by_program.items())
            )
        )
        if listing:
            for file in sorted(files):
                names = sorted(
                    name + ("*" if (f, name) in path.on_chain else "")
                    for f, name in functions
                    if f == file
                )
                print(f"  {'*' if file in chain_files else ' '} {file}: {', '.join(names)}")


class PhasePath:
    """One phase's path: the frames on the chains to its effects, and what they called."""

    def __init__(self) -> None:
        self.on_chain: set[Frame] = set()
        self.functions: set[Frame] = set()
        self.files_by_program: dict[str, set[str]] = defaultdict(set)

    def update(self, other: PhasePath) -> None:
        self.on_chain |= other.on_chain
        self.functions |= other.functions
        for program, files in other.files_by_program.items():
            self.files_by_program[program] |= files


def phase_paths(records: Path) -> dict[str, PhasePath]:
    """Each phase's path in one run's records: the chains recorded in its window (not the
    test process's own), and what the functions on them called meanwhile."""
    windows: dict[str, dict[str, float]] = defaultdict(dict)
    for line in (records / "phases.jsonl").read_text().splitlines():
        mark = json.loads(line)
        windows[mark["phase"]][mark["edge"]] = mark["t"]
    chains: dict[str, list[tuple[str, list[Frame]]]] = defaultdict(list)
    edges: list[tuple[int, Frame, Frame]] = []
    for process_records in records.glob("*.jsonl"):
        if process_records.name == "phases.jsonl":
            continue
        for line in process_records.read_text().splitlines():
            record = json.loads(line)
            if "flushed" in record:
                continue
            if "tenth" in record:
                edges.append((record["tenth"], tuple(record["caller"]), tuple(record["callee"])))
                continue
            program = Path(str(record["argv"][0])).name
            if "pytest" in " ".join(record["argv"]):
                continue
            for phase, window in windows.items():
                if window["start"] <= record["t"] <= window["end"]:
                    chain = [
                        (file, function)
                        for file, function in record["chain"]
                        if not file.startswith(LEFT_OUT)
                    ]
                    if chain:
                        chains[phase].append((program, chain))
    paths: dict[str, PhasePath] = {}
    for phase, window in windows.items():
        path = paths[phase] = PhasePath()
        path.on_chain = {frame for _, chain in chains[phase] for frame in chain}
        path.functions = path.on_chain | {
            callee
            for tenth, caller, callee in edges
            if int(window["start"] * 10) <= tenth <= window["end"] * 10 and caller in path.on_chain
        }
        for program, chain in chains[phase]:
            path.files_by_program[program].update(file for file, _ in chain)
    return paths


def _commit(checkout: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
    ).stdout.strip()


if __name__ == "__main__":
    main()
