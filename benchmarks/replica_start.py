"""How long a replica takes from placement to serving: the event log's ``replica_placed``
to its ``replica_serving``, over cycles of scaling a model up and back down.

    python benchmarks/replica_start.py [--cycles 3] [--replicas 9] [--rounds 2]
        [--baseline CHECKOUT]

One cluster per round, as the end-to-end tests build it (``tests/support/cluster.py``: a
control plane, three agents with four fake GPUs each, the engine simulator as the
engine), on a fresh database: a model declared with one replica, then ``--cycles`` times
scaled to ``--replicas`` (placed at once, started together) and back to one. The figure is
each new replica's placement to serving: the engine's own start (the simulator's Python
start, about half a second alone here), the agent noticing that it serves, and the report
reaching the log. With ``--baseline``, rounds alternate between that checkout (with a
``.venv`` of its own) and this one, so both see the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = "start-probe"


async def measure(cycles: int, replicas: int) -> list[float]:
    """Placement to serving of every replica placed, in seconds."""
    from app.domain.model_spec import ModelSpec
    from benchmarks.autoscale import ENGINE, GPUS_PER_NODE, NODES
    from benchmarks.common import bench_server, fresh_database
    from tests.support.cluster import Cluster, issue_pki
    from tests.support.databases import TEST_RUNTIME_ROLE
    from tests.support.waiting import wait_until

    workdir = Path(tempfile.mkdtemp(prefix="replica-start-"))
    with bench_server() as server:
        async with (
            fresh_database(server, "llmgw_replica_start", TEST_RUNTIME_ROLE) as url,
            Cluster(url, workdir, issue_pki(workdir / "pki")) as cluster,
        ):
            cluster.start_server()
            await cluster.wait_for_leader()
            for node in NODES:
                cluster.start_agent(node, fake_gpus=f"{GPUS_PER_NODE}x80GB")
            await cluster.wait_for_nodes_connected(NODES)
            spec = ModelSpec(name=MODEL, command=ENGINE, replicas=1, startup_timeout_s=60)
            await cluster.apply_model(spec)
            await cluster.wait_for_serving(MODEL, 1, within_s=60)

            async def back_to_one() -> bool:
                ended = {"stopped", "failed", "timed_out", "lost"}
                live = await cluster.replicas(model=MODEL)
                return sum(r["phase"] not in ended for r in live) == 1

            for _ in range(cycles):
                await cluster.scale(MODEL, replicas)
                await cluster.wait_for_serving(MODEL, replicas, within_s=60)
                await cluster.scale(MODEL, 1)
                await wait_until(back_to_one, within_s=60, what="one replica left")
            log = await cluster.events("replica_placed", "replica_serving")
    placed = {e.data["replica_id"]: e.recorded_at for e in log if e.type == "replica_placed"}
    return sorted(
        (e.recorded_at - placed[e.data["replica_id"]]).total_seconds()
        for e in log
        if e.type == "replica_serving" and e.data["replica_id"] in placed
    )


def run_in(checkout: Path, cycles: int, replicas: int) -> list[float]:
    """One round in ``checkout``, by its own interpreter."""
    completed = subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            str(HERE / "replica_start.py"),
            "--round-only",
            "--cycles",
            str(cycles),
            "--replicas",
            str(replicas),
        ],
        cwd=checkout,
        env=os.environ | {"PYTHONPATH": str(checkout)},
        check=True,
        capture_output=True,
        text=True,
    )
    figures: list[float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return figures


def describe(starts: list[float]) -> str:
    p90 = starts[min(len(starts) - 1, int(len(starts) * 0.9))]
    return f"{len(starts)} starts, median {statistics.median(starts):.2f} s, p90 {p90:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=9, help="at most the 12 fake GPUs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    parser.add_argument("--round-only", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if not 2 <= arguments.replicas <= 12 or arguments.cycles < 1:
        parser.error("--replicas must be 2 to 12, --cycles at least 1")
    if arguments.round_only:
        print(json.dumps(asyncio.run(measure(arguments.cycles, arguments.replicas))))
        return
    checkouts = [HERE.parent]
    if arguments.baseline is not None:
        checkouts.insert(0, arguments.baseline.resolve())
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    every: dict[Path, list[float]] = {c: [] for c in checkouts}
    for number in range(1, arguments.rounds + 1):
        for checkout in checkouts:
            starts = run_in(checkout, arguments.cycles, arguments.replicas)
            every[checkout] += starts
            print(f"round {number}, {checkout}: {describe(starts)}", flush=True)
    for checkout, starts in every.items():
        print(f"all rounds, {checkout}: {describe(sorted(starts))}")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
