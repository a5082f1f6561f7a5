"""How a model is doing, as ``llmgw-cli model`` shows it: its replicas by phase, why fewer
serve than are desired, and why replicas on unhealthy GPUs wait to be moved. Pure, from the
state alone."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import msgspec

from app.domain.failure_count import failures_in_a_row, failures_told
from app.domain.gpu_moves import waiting_gpu_moves
from app.domain.model_operations import find_model
from app.domain.state import (
    ACTIVE_PHASES,
    COUNTING_PHASES,
    NOT_SERVING_YET,
    ClusterState,
    Model,
    Replica,
    ReplicaPhase,
)


class ModelStatus(msgspec.Struct, frozen=True, kw_only=True):
    model: Model
    phases: dict[str, int]
    """Replicas of the model by phase, ended ones included."""
    serving: int
    counting: int
    """Placed, starting or serving: the replicas that count towards the desired count."""
    below_desired_because: tuple[str, ...]
    """Empty when as many replicas serve as are desired."""
    outdated: tuple[str, ...] = ()
    """Active replicas placed with another revision than the model's (an older one, or a
    newer one that was rolled back), by number: they run theirs until they are replaced."""
    waiting_to_move: tuple[str, ...] = ()
    """Each replica on an unhealthy GPU whose move waits for the model's moves under way
    (``max_moves``), with why (``gpu_moves.waiting_gpu_moves``)."""


def model_status(state: ClusterState, name: str, now: datetime) -> ModelStatus:
    model = find_model(state, name)
    replicas = [r for r in state.replicas.values() if r.model == name]
    phases = Counter(r.phase for r in replicas)
    phases.update({ReplicaPhase(phase): n for phase, n in model.forgotten.items()})
    serving = phases[ReplicaPhase.SERVING]
    counting = sum(phases[p] for p in COUNTING_PHASES)
    reasons = (
        _below_desired(model, replicas, phases, counting, now) if serving < model.desired else ()
    )
    return ModelStatus(
        model=model,
        phases={phase.value: n for phase, n in sorted(phases.items())},
        serving=serving,
        counting=counting,
        below_desired_because=reasons,
        outdated=tuple(
            r.id
            for r in sorted(replicas, key=lambda r: r.number)
            if r.phase in ACTIVE_PHASES and r.revision != model.revision
        ),
        waiting_to_move=waiting_gpu_moves(state, name),
    )


def _below_desired(
    model: Model,
    replicas: list[Replica],
    phases: Counter[ReplicaPhase],
    counting: int,
    now: datetime,
) -> tuple[str, ...]:
    reasons: list[str] = []
    missing = model.desired - counting
    if missing > 0:
        if model.backoff_until is not None and now < model.backoff_until:
            reasons.append(
                f"placement waits until {model.backoff_until:%Y-%m-%d %H:%M:%S} after "
                f"{failures_in_a_row(model.failures)}"
            )
        if model.unplaceable_reason:
            reasons.append(f"cannot place {missing} replica(s): {model.unplaceable_reason}")
        elif not reasons:
            reasons.append(f"{missing} replica(s) not placed yet")
    starting = sum(phases[p] for p in NOT_SERVING_YET)
    if starting:
        reasons.append(f"{starting} replica(s) placed or starting, not serving yet")
    if phases[ReplicaPhase.DRAINING]:
        reasons.append(
            f"{phases[ReplicaPhase.DRAINING]} replica(s) draining: they serve until their "
            "replacements do"
        )
    if model.failures:
        last = max(
            (r for r in replicas if r.phase in (ReplicaPhase.FAILED, ReplicaPhase.TIMED_OUT)),
            key=lambda r: (r.ended_at or r.placed_at, r.number),
            default=None,
        )
        detail = f": {last.id} {_how_it_ended(last)}" if last else ""
        reasons.append(f"{failures_told(model.failures)}{detail}")
    return tuple(reasons)


def _how_it_ended(replica: Replica) -> str:
    return replica.end_told_whole or f"{replica.phase.value}, {replica.end_reason}"
