"""How long the autoscaler's decision takes in one reconcile pass, with many autoscaled models.

    python benchmarks/autoscale_decide.py [--models 1000] [--rounds 15]
    python benchmarks/autoscale_decide.py --baseline ../base     # beside another checkout

Every model has the default policy but ``min`` 0 and ``max`` 32 (up window 10 s, down window
300 s, idle to zero 900 s: a leader keeps 903 samples of it, a pass a second) and a demand
that swings slowly between 10 and 30, so each pass computes every mean the decision may use
and weighs a drop. Measured: one pass's ``app.domain.autoscale.decide`` over every model
(pure: no database, no sockets), the median and p90 of ``--rounds``; beside it, as the
machine's yardstick, one pass reading each sample's figure once. With ``--baseline``, the
same script also runs in the other checkout (with its own ``.venv``), rounds alternating.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.domain.autoscale import DemandSample
    from app.domain.state import Model

HERE = Path(__file__).resolve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout, with its own .venv")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.json:
        print(json.dumps(measure(arguments.models, arguments.rounds)))
        return
    checkouts = {"this": HERE.parents[1]}
    if arguments.baseline is not None:
        checkouts["baseline"] = arguments.baseline.resolve()
    results: dict[str, dict[str, list[float]]] = {
        name: {"decide_ms": [], "yardstick_ms": []} for name in checkouts
    }
    for _ in range(arguments.rounds):
        for name, checkout in checkouts.items():
            figures = _run(checkout, arguments.models)
            for key, values in figures.items():
                results[name][key] += values
    for name, checkout in checkouts.items():
        decide = results[name]["decide_ms"]
        yardstick = results[name]["yardstick_ms"]
        print(
            f"{name:8} {_commit(checkout)}: decide over {arguments.models} models "
            f"median {statistics.median(decide):.1f} ms, p90 {_p90(decide):.1f} ms "
            f"(reading every sample once: {statistics.median(yardstick):.1f} ms)"
        )
    if "baseline" in results:
        ratio = statistics.median(results["this"]["decide_ms"]) / statistics.median(
            results["baseline"]["decide_ms"]
        )
        print(f"this / baseline: {ratio:.2f}")


def _run(checkout: Path, models: int) -> dict[str, list[float]]:
    """One round in ``checkout``'s own interpreter and code."""
    done = subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            *(str(HERE), "--json", "--models", str(models), "--rounds", "1"),
        ],
        cwd=checkout,
        env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, list[float]] = json.loads(done.stdout)
    return figures


def measure(models: int, rounds: int) -> dict[str, list[float]]:
    """``rounds`` passes over ``models`` models: the decision's time and the yardstick's."""
    from app.domain import autoscale

    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    fleet = _models(models)
    history = _history(fleet, now)
    decide_ms, yardstick_ms = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        for name, model in fleet.items():
            autoscale.decide(model, history[name], now)
        decide_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        total = 0.0
        for samples in history.values():
            for sample in samples:
                total += sample.demand
        yardstick_ms.append((time.perf_counter() - started) * 1000)
    return {"decide_ms": decide_ms, "yardstick_ms": yardstick_ms}


def _models(count: int) -> dict[str, Model]:
    from app.domain.envelope import Meta, Recorded
    from app.domain.events import ModelDeclared
    from app.domain.evolve import evolve
    from app.domain.model_spec import AutoscalePolicy, ModelSpec
    from app.domain.state import ClusterState

    state = ClusterState()
    policy = AutoscalePolicy(min_replicas=0, max_replicas=32)
    for number in range(count):
        name = f"m{number}"
        spec = ModelSpec(name=name, command="sim --port {port}", replicas=5, autoscale=policy)
        recorded = Recorded(
            position=number + 1,
            stream=f"model-{name}",
            version=1,
            event_id=uuid.uuid4(),
            recorded_at=datetime(2026, 12, 4, tzinfo=UTC),
            meta=Meta(actor="bench"),
            event=ModelDeclared(model=name, spec=spec),
        )
        state = evolve(state, recorded)
    return dict(state.models)


def _history(fleet: dict[str, Model], now: datetime) -> dict[str, tuple[DemandSample, ...]]:
    """What ``observe`` keeps of a quarter of an hour of passes a second apart (903 samples:
    the idle-to-zero window and its slack), the same for every model."""
    from app.domain import autoscale

    start = now - timedelta(seconds=902)
    samples = tuple(
        autoscale.DemandSample(start + timedelta(seconds=second), 20 + 10 * math.sin(second / 60))
        for second in range(903)
    )
    return dict.fromkeys(fleet, samples)


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, math.ceil(len(values) * 0.9) - 1)]


def _commit(checkout: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
    ).stdout.strip()


if __name__ == "__main__":
    main()
