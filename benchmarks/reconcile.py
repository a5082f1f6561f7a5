"""How fast the reconciler decides, on a fleet of 1,000 nodes with 8 GPUs each.

    python benchmarks/reconcile.py [--nodes 1000] [--replicas 4000] [--repeat 15]
                                   [--rollout-replicas 1000] [--surges 1:300,10,100]
    python benchmarks/reconcile.py --nodes 5000 --replicas 20000 --rollout-replicas 0

(The second: the largest fleet ``docs/scaling.md`` speaks of, 20,000 replicas on 5,000
nodes; ``--replicas`` may be at most 8 per node, and the 100 placements need room.)

Measured, pure (no database, no sockets; the decisions are what the control plane runs on
every pass):
- one ``explain_placement`` of a model that fits (target: <= 20 ms);
- one full reconcile pass with nothing to do (target: <= 50 ms);
- one full reconcile pass with 100 replicas to place (target: <= 50 ms).
Medians (and p90, p95) of ``--repeat`` runs; a baseline of the same size, one pass over
the replicas doing nothing but reading them, is reported beside it so the machine's speed is
visible. Building the fleet folds its history event by event, as a control plane catching
up at its start does: how many events a second the fold takes, and the benchmark's peak
memory with the fleet folded, are reported too.

Then a rollout (``benchmarks/rollout_scenario.py``): one more model of
``--rollout-replicas`` replicas, one per node, gets a new revision, and the passes that
bring every replica to it run against simulated agents, once per ``--surges`` entry
(``SURGE`` or ``SURGE:PASSES``, the rollout's ``max_surge`` and at most that many passes;
without a bound, until ``RolloutFinished``). Each pass is timed (median, p95, max) and set
against the same fleet's pass with nothing to do, timed after each one (target of a pass:
<= 50 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    ModelDeclared,
    ModelScaled,
    NodeConnected,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
    ShardReady,
    ShardStarting,
)
from app.domain.evolve import evolve
from app.domain.model_spec import ModelSpec
from app.domain.placement import explain_placement
from app.domain.reconcile import Settings, decide
from app.domain.reports import FleetView, NodeReport, ReportedShard
from app.domain.state import ClusterState
from benchmarks.common import format_table, load_average, peak_rss_mib, write_results
from benchmarks.rollout_scenario import RolloutRun, run_rollout, with_model

T0 = datetime(2026, 11, 2, tzinfo=UTC)
EPOCH = 1
MODELS = 40


class Figure(msgspec.Struct, frozen=True):
    name: str
    median_ms: float
    p90_ms: float
    target_ms: float | None
    p95_ms: float | None = None


class RolloutFigure(msgspec.Struct, frozen=True, kw_only=True):
    max_surge: int
    passes: int
    finished: bool
    replaced: int
    max_moves: int
    median_ms: float
    p95_ms: float
    max_ms: float
    steady_median_ms: float
    """The same fleet's pass with nothing to do (before the revision changed), timed after
    each pass of the rollout."""
    traffic_wanted_median_ms: float | None
    simulated_s: float
    wall_s: float
    events: int


class Fold(msgspec.Struct, frozen=True):
    """Folding the fleet's history into a ``ClusterState``, one event at a time."""

    events: int
    seconds: float
    events_per_s: float
    peak_rss_mib: float
    """The benchmark process's peak resident memory once the fleet is folded."""


class Results(msgspec.Struct, frozen=True):
    nodes: int
    replicas: int
    repeat: int
    load_average: tuple[float, float, float]
    figures: list[Figure]
    rollout_replicas: int = 0
    rollouts: list[RolloutFigure] = []
    fold: Fold | None = None


def fleet(nodes: int, replicas: int) -> tuple[ClusterState, FleetView]:
    """``nodes`` nodes of 8 H100s and ``replicas`` serving single-GPU replicas spread over
    ``MODELS`` models, every shard reported running by its agent."""
    if replicas > 8 * nodes:
        raise ValueError(f"{replicas} single-GPU replicas do not fit on {nodes} nodes of 8 GPUs")
    state = ClusterState()
    position = 0

    def fold(event: AnyEvent) -> None:
        nonlocal position
        position += 1
        evolve(
            state,
            Recorded(
                position=position,
                stream="s",
                version=1,
                event_id=uuid.UUID(int=position),
                recorded_at=T0,
                meta=Meta(actor="bench", epoch=EPOCH),
                event=event,
            ),
        )

    for n in range(nodes):
        gpus = tuple(
            GpuInfo(index=i, uuid=f"GPU-{n:04}-{i}", name="H100", memory_total_mib=81559)
            for i in range(8)
        )
        fold(NodeConnected(node_id=f"gpu-{n:04}", address=f"127.{n // 250}.{n % 250}.1", gpus=gpus))
    per_model = replicas // MODELS
    for m in range(MODELS):
        spec = ModelSpec(name=f"model-{m}", command="vllm serve --port {port}", replicas=per_model)
        fold(ModelDeclared(model=spec.name, spec=spec))
    reports: dict[str, dict[tuple[str, int], ReportedShard]] = {}
    for r in range(replicas):
        model = f"model-{r % MODELS}"
        number = r // MODELS + 1
        replica_id = f"{model}-{number}"
        node = f"gpu-{r % nodes:04}"
        gpu = (r // nodes) % 8
        port = 20000 + r // nodes
        shard = ShardPlacement(index=0, node_id=node, gpus=(gpu,), port=port)
        fold(ReplicaPlaced(replica_id=replica_id, model=model, number=number, shards=(shard,)))
        fold(ShardStarting(replica_id=replica_id, shard_index=0, node_id=node, pid=r + 100))
        fold(ShardReady(replica_id=replica_id, shard_index=0, node_id=node))
        fold(ReplicaServing(replica_id=replica_id))
        reports.setdefault(node, {})[(replica_id, 0)] = ReportedShard(
            replica_id=replica_id, shard_index=0, model=model, port=port, pid=r + 100, state="ready"
        )
    view = FleetView(
        reports={n: NodeReport(node_id=n, shards=reports.get(n, {})) for n in state.nodes}
    )
    return state, view


def timed(run: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def figure(name: str, samples: list[float], target: float | None) -> Figure:
    ordered = sorted(samples)
    return Figure(
        name=name,
        median_ms=round(statistics.median(ordered), 2),
        p90_ms=round(percentile(ordered, 0.9), 2),
        target_ms=target,
        p95_ms=round(percentile(ordered, 0.95), 2),
    )


def surges(text: str) -> list[tuple[int, int]]:
    """``1:300,10,100`` -> ``[(1, 300), (10, 0), (100, 0)]``: each rollout's ``max_surge``
    and its bound on passes (0: none)."""
    runs = []
    for item in text.split(","):
        surge, _, passes = item.strip().partition(":")
        try:
            runs.append((int(surge), int(passes or 0)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not SURGE or SURGE:PASSES") from None
    return runs


def percentile(ordered: list[float], share: float) -> float:
    return ordered[int(share * (len(ordered) - 1))]


def rollout_figure(run: RolloutRun) -> RolloutFigure:
    ordered = sorted(run.pass_ms)
    wanted = run.traffic_wanted_ms
    return RolloutFigure(
        max_surge=run.max_surge,
        passes=run.passes,
        finished=run.finished,
        replaced=run.replaced,
        max_moves=run.max_moves,
        median_ms=round(statistics.median(ordered), 2),
        p95_ms=round(percentile(ordered, 0.95), 2),
        max_ms=round(ordered[-1], 2),
        steady_median_ms=round(statistics.median(run.steady_ms), 2),
        traffic_wanted_median_ms=round(statistics.median(wanted), 2) if wanted else None,
        simulated_s=run.simulated_s,
        wall_s=run.wall_s,
        events=run.events,
    )


def measure_rollouts(
    state: ClusterState,
    view: FleetView,
    now: datetime,
    settings: Settings,
    args: argparse.Namespace,
) -> list[RolloutFigure]:
    """The fleet with one more model of ``--rollout-replicas``, its pass with nothing to
    do, then a rollout of it for each ``--surges`` entry, each from the same start."""
    fleet_state = state.copy()
    fleet_view = with_model(fleet_state, view, args.rollout_replicas, T0)
    idle = decide(fleet_state, fleet_view, now, settings)
    assert idle.events == (), "the fleet should need nothing"
    assert idle.commands == (), "the fleet should need nothing"
    figures = []
    for surge, passes in args.surges:
        run = run_rollout(fleet_state, fleet_view, now, settings, surge, passes)
        figures.append(rollout_figure(run))
        done = "finished" if run.finished else f"stopped, {run.replaced} replaced"
        print(f"max_surge {surge}: {run.passes} passes ({done}) in {run.wall_s:.0f}s")
    return figures


def rollout_rows(figures: list[RolloutFigure], replicas: int) -> list[list[str]]:
    rows = []
    for f in figures:
        how = "until finished" if f.finished else f"first {f.passes} passes"
        rows.append(
            [
                f"rollout of {replicas}, max_surge {f.max_surge}, {how}",
                str(f.passes),
                f"{f.median_ms:.2f}",
                f"{f.p95_ms:.2f}",
                f"{f.max_ms:.2f}",
                f"{f.steady_median_ms:.2f}",
                f"{f.median_ms / f.steady_median_ms:.2f}",
                "met" if f.median_ms <= 50 else "MISSED",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--rollout-replicas", type=int, default=1000, help="0: no rollout is measured"
    )
    parser.add_argument("--surges", type=surges, default=surges("1:300,10,100"))
    args = parser.parse_args()

    if args.replicas > 8 * args.nodes:
        parser.error(f"--replicas {args.replicas} do not fit on --nodes {args.nodes} (8 GPUs each)")
    built = time.perf_counter()
    state, view = fleet(args.nodes, args.replicas)
    seconds = time.perf_counter() - built
    fold = Fold(
        events=state.position,
        seconds=round(seconds, 2),
        events_per_s=round(state.position / seconds),
        peak_rss_mib=peak_rss_mib(),
    )
    print(
        f"built a fleet of {args.nodes} nodes and {args.replicas} replicas in {seconds:.1f}s: "
        f"{fold.events:,} events folded, {fold.events_per_s:,.0f} a second "
        f"(with building the reports); peak RSS {fold.peak_rss_mib:.0f} MiB"
    )
    settings = Settings(epoch=EPOCH, started_at=T0 - timedelta(hours=1))
    now = T0 + timedelta(hours=1)
    spec = ModelSpec(name="new-model", command="x", gpus_per_shard=4, gpu_memory_gib=40)

    idle = decide(state, view, now, settings)
    assert idle.events == (), "the fleet should need nothing"
    assert idle.commands == (), "the fleet should need nothing"
    grown = state.copy()
    for m in range(10):  # ten models each ask for ten more replicas: 100 placements
        model = grown.models[f"model-{m}"]
        evolve(
            grown,
            Recorded(
                position=grown.position + 1,
                stream="s",
                version=1,
                event_id=uuid.uuid4(),
                recorded_at=now,
                meta=Meta(actor="bench"),
                event=ModelScaled(
                    model=model.name, replicas=model.desired + 10, previous=model.desired
                ),
            ),
        )
    placing = decide(grown, view, now, settings)
    placed = sum(1 for p in placing.events if isinstance(p.event, ReplicaPlaced))
    assert placed == 100, f"expected 100 placements, got {placed}"

    figures = [
        figure(
            "baseline: read every replica once",
            timed(lambda: sum(len(r.shards) for r in state.replicas.values()), args.repeat),
            None,
        ),
        figure(
            "explain-placement (4 GPUs x 40 GiB)",
            timed(lambda: explain_placement(state, spec), args.repeat),
            20,
        ),
        figure(
            "reconcile pass, nothing to do",
            timed(lambda: decide(state, view, now, settings), args.repeat),
            50,
        ),
        figure(
            "reconcile pass, 100 placements",
            timed(lambda: decide(grown, view, now, settings), args.repeat),
            50,
        ),
    ]
    rows = [
        [
            f.name,
            f"{f.median_ms:.2f}",
            f"{f.p90_ms:.2f}",
            f"{f.p95_ms:.2f}",
            "-" if f.target_ms is None else f"<= {f.target_ms:g}",
            "-" if f.target_ms is None else ("met" if f.median_ms <= f.target_ms else "MISSED"),
        ]
        for f in figures
    ]
    print(format_table(["measure", "median ms", "p90 ms", "p95 ms", "target", ""], rows))
    rollouts: list[RolloutFigure] = []
    if args.rollout_replicas > 0:
        rollouts = measure_rollouts(state, view, now, settings, args)
        headers = ["measure", "passes", "median ms", "p95 ms", "max ms", "steady ms", "x", ""]
        print(format_table(headers, rollout_rows(rollouts, args.rollout_replicas)))
        print(
            f"steady: the same fleet ({args.replicas + args.rollout_replicas} replicas), "
            "a pass with nothing to do; x: median / steady; target of a pass: <= 50 ms"
        )
    print(f"load average: {load_average()}")
    path = write_results(
        "reconcile",
        Results(
            nodes=args.nodes,
            replicas=args.replicas,
            repeat=args.repeat,
            load_average=load_average(),
            figures=figures,
            rollout_replicas=args.rollout_replicas,
            rollouts=rollouts,
            fold=fold,
        ),
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
