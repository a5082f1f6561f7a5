"""Rollouts: a model's replicas brought from one revision to the next, step by step, each
canary step judged by what the gateways measured.

A declaration that makes a new revision starts a rollout (``RolloutStarted``, recorded with
it). Each pass, for every rollout under way, the reconciler:

- rolls it back when ``max_failures`` replicas of the new revision failed to start: the
  model is at the old revision again and its old replicas were never touched;
- starts the current step (``RolloutStepStarted``) and brings its count of new replicas
  up. Each serving replica of an older revision is replaced by a **move**, the drain's
  mechanism: it is marked draining (with the rollout's id as its drain id), a replacement
  of the model's current revision is placed, and it stops once that has served for the
  stability window. At most ``max_surge`` moves run at once; ``max_unavailable`` replicas
  may instead stop before their replacement serves. In the last step (every replica), old
  replicas that are not serving yet have nothing to protect and stop at once;
- once the step's replicas serve, holds it (``RolloutHolding``), then judges it from the
  gateways' figures of the new revision against the model's other replicas, and the
  replicas they eject (``RolloutVerdict``, ``app.domain.rollout_verdict``): promote to the
  next step, roll back, or pause for an operator when too few requests or latency samples
  were seen to tell;
- when every replica runs the new revision, finishes it (``RolloutFinished``).

A rollout rolled back (by a verdict, by failures, or by ``rollout undo``) is brought home
the same way: the model's revision is the old one again, so its replicas of the new one are
the ones replaced, and moves of old replicas it had started are called off. Everything the
reconciler decides here is an event with the rollout's id as correlation id, so a control
plane that restarts anywhere in a rollout resumes it from the log exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

from msgspec.structs import replace

from app.domain.decision import Draft
from app.domain.events import (
    JudgedFigures,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaStopping,
    RolloutFinished,
    RolloutHolding,
    RolloutPaused,
    RolloutRolledBack,
    RolloutStepStarted,
    RolloutVerdict,
    model_stream,
    replica_stream,
)
from app.domain.model_spec import CanaryStep
from app.domain.revisions import REVISION_FIELDS
from app.domain.rollout_verdict import (
    INCONCLUSIVE,
    PROMOTE,
    ROLL_BACK,
    Ejected,
    judge,
    waiting_for,
)
from app.domain.state import (
    ACTIVE_PHASES,
    ClusterState,
    Model,
    Replica,
    ReplicaPhase,
    Rollout,
    RolloutState,
)
from app.domain.traffic import TrafficFigures

# The verdict lives in ``app.domain.rollout_verdict``; its words are read here too.
__all__ = ["INCONCLUSIVE", "PROMOTE", "ROLL_BACK", "judge"]

RolloutEvent = (
    RolloutStepStarted
    | RolloutHolding
    | RolloutVerdict
    | RolloutPaused
    | RolloutRolledBack
    | RolloutFinished
)

_COUNTING = frozenset({ReplicaPhase.PLACED, ReplicaPhase.STARTING, ReplicaPhase.SERVING})
_NOT_SERVING_YET = frozenset({ReplicaPhase.PLACED, ReplicaPhase.STARTING})


def canary_group(model: str) -> str:
    """The key of a model's new-revision replicas in ``FleetView.traffic``."""
    return f"{model} canary"


def stable_group(model: str) -> str:
    """The key of a model's other replicas in ``FleetView.traffic``."""
    return f"{model} stable"


def traffic_wanted(state: ClusterState) -> dict[str, list[str]]:
    """The replicas whose gateway figures the verdicts of this pass need, by group: for each
    rollout holding a step, its new revision's active replicas and the model's others.
    Empty (nothing to read) when no rollout holds."""
    wanted: dict[str, list[str]] = {}
    holding = {
        name: model.rollout.revision
        for name, model in state.models.items()
        if model.rollout is not None
        and model.rollout.state is RolloutState.RUNNING
        and model.rollout.holding_since is not None
    }
    if not holding:
        return wanted
    for replica in state.replicas.values():
        revision = holding.get(replica.model)
        if revision is None or replica.phase not in ACTIVE_PHASES:
            continue
        group = canary_group if replica.revision == revision else stable_group
        wanted.setdefault(group(replica.model), []).append(replica.id)
    return wanted


def verdict_groups(model: Model, replicas: Iterable[Replica]) -> dict[str, list[str]]:
    """The groups a verdict of ``model``'s rollout would read now (as ``traffic_wanted``):
    its new revision's active replicas and the model's others; empty when the rollout
    holds no step."""
    rollout = model.rollout
    if (
        rollout is None
        or rollout.state is not RolloutState.RUNNING
        or rollout.holding_since is None
    ):
        return {}
    groups: dict[str, list[str]] = {}
    for replica in replicas:
        if replica.model != model.name or replica.phase not in ACTIVE_PHASES:
            continue
        group = canary_group if replica.revision == rollout.revision else stable_group
        groups.setdefault(group(model.name), []).append(replica.id)
    return groups


def verdict_waits_for(
    model: Model,
    replicas: Iterable[Replica],
    traffic: Mapping[str, TrafficFigures],
    ejected: Mapping[str, int],
) -> str | None:
    """What the verdict of ``model``'s holding step, taken on these figures now, would still
    wait for (too few requests or latency samples on a side, with the counts); None when it
    would decide, or no step holds. ``traffic`` by ``verdict_groups``; ``ejected``: the
    replicas gateways eject, with how many of them do."""
    rollout = model.rollout
    if rollout is None or not verdict_groups(model, replicas):
        return None
    return waiting_for(
        traffic.get(canary_group(model.name)),
        traffic.get(stable_group(model.name)),
        model.spec.rollout,
        _ejected(replicas, model, rollout, ejected),
    )


def new_revision_room(state: ClusterState, model: Model) -> int | None:
    """How many more replicas of ``model``'s current revision its rollout's step lets the
    model place now; None when no rollout under way limits them (none, one rolling back,
    or one at its last step, which brings every replica to the new revision).

    A replica the model places beyond that (it was scaled up, by an operator or the
    autoscaler, or a drain moves one of its replicas) runs the revision the rollout comes
    from, so a step never runs the new revision on more replicas than it allows, and a
    model scaled up from zero while its rollout is paused still meets the canary first."""
    rollout = model.rollout
    if (
        rollout is None
        or rollout.state not in (RolloutState.RUNNING, RolloutState.PAUSED)
        or rollout.revision != model.revision
        or rollout.from_revision not in model.earlier_specs
    ):
        return None
    steps = model.spec.rollout.all_steps
    allowed = steps[min(rollout.step, len(steps) - 1)].count(model.desired)
    if allowed >= model.desired:
        return None
    running = sum(
        1
        for replica in _active(state, model.name)
        if replica.revision == model.revision and replica.phase in _COUNTING
    )
    return max(allowed - running, 0)


def rollout_moves(
    draft: Draft,
    traffic: Mapping[str, TrafficFigures],
    ejected: Mapping[str, int] | None = None,
) -> None:
    """Advance every rollout under way by what the state and the gateways' figures say;
    ``ejected``: the replicas live gateways keep out of rotation for failing, each with how
    many of them do (``FleetView.ejected``)."""
    for name in sorted(draft.state.models):
        model = draft.state.models[name]
        rollout = model.rollout
        if rollout is None or not rollout.under_way:
            continue
        if model.removed:
            _finish(draft, model, rollout, succeeded=False, outcome="the model was removed")
        elif rollout.state is RolloutState.ROLLING_BACK:
            _bring_back(draft, model, rollout)
        elif rollout.failures >= model.spec.rollout.max_failures:
            # Paused too: a pause stops new moves, not the replacements of the new revision
            # the model keeps placing, and their failures count all the same.
            _roll_back(draft, model, rollout, _failed_to_start(model, rollout))
        elif rollout.state is RolloutState.RUNNING:
            _advance(draft, model, rollout, traffic, ejected or {})


def _failed_to_start(model: Model, rollout: Rollout) -> str:
    return (
        f"{rollout.failures} replica(s) of revision {rollout.revision} failed to start "
        f"(max_failures {model.spec.rollout.max_failures}); last: {rollout.last_failure}"
    )


def _advance(
    draft: Draft,
    model: Model,
    rollout: Rollout,
    traffic: Mapping[str, TrafficFigures],
    ejected: Mapping[str, int],
) -> None:
    policy = model.spec.rollout
    steps = policy.all_steps
    index = min(rollout.step, len(steps) - 1)
    step = steps[index]
    if rollout.step_started_at is None:
        _start_step(draft, model, rollout, index, step)
        return
    last = index == len(steps) - 1
    target = step.count(model.desired)
    if not _converge(draft, model, rollout, target, every=last):
        return
    if last:
        outcome = f"every replica runs revision {rollout.revision}"
        _finish(draft, model, rollout, succeeded=True, outcome=outcome)
        return
    if rollout.promoted or step.hold_s <= 0:
        _start_step(draft, model, rollout, index + 1, steps[index + 1])
        return
    if rollout.holding_since is None:
        _record(
            draft,
            rollout,
            RolloutHolding(model=model.name, rollout_id=rollout.id, step=index, hold_s=step.hold_s),
        )
        return
    if draft.now < rollout.holding_since + timedelta(seconds=step.hold_s):
        return
    sides = _ejected(_active(draft.state, model.name), model, rollout, ejected)
    _judge(draft, model, rollout, index, traffic, sides)


def _record(draft: Draft, rollout: Rollout, event: RolloutEvent) -> None:
    """A step of the rollout, on its model's stream under the rollout's id."""
    draft.emit(model_stream(event.model), event, correlation_id=rollout.id)


def _start_step(draft: Draft, model: Model, rollout: Rollout, index: int, step: CanaryStep) -> None:
    replicas = step.count(model.desired)
    _record(
        draft,
        rollout,
        RolloutStepStarted(
            model=model.name,
            rollout_id=rollout.id,
            step=index,
            replicas=replicas,
            traffic=step.traffic,
            hold_s=step.hold_s,
        ),
    )


def _judge(
    draft: Draft,
    model: Model,
    rollout: Rollout,
    index: int,
    traffic: Mapping[str, TrafficFigures],
    ejected: Ejected,
) -> None:
    canary = traffic.get(canary_group(model.name))
    stable = traffic.get(stable_group(model.name))
    verdict, reason = judge(canary, stable, model.spec.rollout, ejected)
    _record(
        draft,
        rollout,
        RolloutVerdict(
            model=model.name,
            rollout_id=rollout.id,
            step=index,
            verdict=verdict,
            reason=reason,
            canary=_judged(canary),
            stable=_judged(stable),
        ),
    )
    if verdict == ROLL_BACK:
        _roll_back(draft, model, rollout, f"step {index + 1}: {reason}")
    elif verdict == INCONCLUSIVE:
        _record(
            draft,
            rollout,
            RolloutPaused(
                model=model.name,
                rollout_id=rollout.id,
                reason=f"no verdict: {reason}; resume to promote, undo to roll back",
            ),
        )
    else:
        steps = model.spec.rollout.all_steps
        _start_step(draft, model, rollout, index + 1, steps[index + 1])


def _ejected(
    replicas: Iterable[Replica], model: Model, rollout: Rollout, ejected: Mapping[str, int]
) -> Ejected:
    """The model's active replicas the gateways eject, by the side of the verdict."""
    canary: dict[str, int] = {}
    stable: dict[str, int] = {}
    for replica in replicas:
        if replica.model != model.name or replica.phase not in ACTIVE_PHASES:
            continue
        gateways = ejected.get(replica.id, 0)
        if gateways > 0:
            side = canary if replica.revision == rollout.revision else stable
            side[replica.id] = gateways
    return Ejected(canary=canary, stable=stable)


def _judged(figures: TrafficFigures | None) -> JudgedFigures | None:
    if figures is None:
        return None
    return JudgedFigures(
        requests=figures.requests,
        errors=figures.errors,
        error_rate=figures.error_rate,
        ttft_p95_ms=figures.ttft_p95_ms,
        tpot_p95_ms=figures.tpot_p95_ms,
        latency_p95_ms=figures.latency_p95_ms,
        gateways=figures.gateways,
        window_s=figures.window_s,
        ttft_samples=figures.ttft_samples,
        tpot_samples=figures.tpot_samples,
        latency_samples=figures.latency_samples,
    )


def _roll_back(draft: Draft, model: Model, rollout: Rollout, reason: str) -> None:
    _record(draft, rollout, rollback_event(model, rollout, reason))
    _bring_back(draft, draft.state.models[model.name], rollout)


def rollback_event(model: Model, rollout: Rollout, reason: str) -> RolloutRolledBack:
    """The model back at the revision ``rollout`` came from, with its spec; the settings
    that are no revision (replicas, routing, the rollout policy) stay as they are now."""
    back = replace(model.spec, **{f: getattr(rollout.from_spec, f) for f in REVISION_FIELDS})
    return RolloutRolledBack(
        model=model.name,
        rollout_id=rollout.id,
        reason=reason,
        to_revision=rollout.from_revision,
        spec=back,
    )


def _bring_back(draft: Draft, model: Model, rollout: Rollout) -> None:
    """Replace the rolled back revision's replicas by the model's (old) revision."""
    for replica in _active(draft.state, model.name):
        if (
            replica.phase is ReplicaPhase.DRAINING
            and replica.drain_id == rollout.id
            and replica.revision == model.revision
        ):
            draft.emit(
                replica_stream(replica.id),
                ReplicaDrainCancelled(
                    replica_id=replica.id,
                    drain_id=rollout.id,
                    reason=f"rollout {rollout.id} rolled back: it runs revision {model.revision}",
                ),
                correlation_id=rollout.id,
            )
    model = draft.state.models[model.name]
    if _converge(draft, model, rollout, model.desired, every=True):
        why = model.rollout.outcome if model.rollout is not None else None
        outcome = f"rolled back to revision {model.revision}: {why}"
        _finish(draft, model, rollout, succeeded=False, outcome=outcome)


def _finish(draft: Draft, model: Model, rollout: Rollout, *, succeeded: bool, outcome: str) -> None:
    _record(
        draft,
        rollout,
        RolloutFinished(
            model=model.name, rollout_id=rollout.id, succeeded=succeeded, outcome=outcome
        ),
    )


def _converge(draft: Draft, model: Model, rollout: Rollout, target: int, *, every: bool) -> bool:
    """Bring the model's replicas of its current revision towards ``target`` serving (all
    of them when ``every``), by moves of this rollout and the stops ``max_unavailable``
    allows. True once there: as many serve, no move of this rollout is under way, and
    (when ``every``) no replica of another revision is left but those stopping."""
    policy = model.spec.rollout
    revision = model.revision
    replicas = _active(draft.state, model.name)
    current = [r for r in replicas if r.revision == revision and r.phase in _COUNTING]
    moving = [m for m in model.moves.values() if m.move_id == rollout.id]
    outdated = [r for r in replicas if r.revision != revision]
    serving_outdated = sorted(
        (r for r in outdated if r.phase is ReplicaPhase.SERVING), key=lambda r: r.number
    )
    if every:
        for replica in outdated:
            if replica.phase in _NOT_SERVING_YET:
                _stop(
                    draft,
                    replica,
                    rollout,
                    f"rollout {rollout.id}: not serving yet, placed again at revision {revision}",
                )
    coming = len(current) + sum(1 for m in moving if m.replacement_id is None)
    need = target - coming
    moves = min(max(need, 0), max(policy.max_surge - len(moving), 0), len(serving_outdated))
    for replica in serving_outdated[:moves]:
        draft.emit(
            replica_stream(replica.id),
            ReplicaDrainStarted(
                replica_id=replica.id,
                drain_id=rollout.id,
                reason=f"rollout to revision {revision}",
            ),
            correlation_id=rollout.id,
        )
    need -= moves
    if need > 0 and policy.max_unavailable > 0:
        unavailable = model.desired - _available(replicas)
        stops = min(need, max(policy.max_unavailable - unavailable, 0))
        for replica in serving_outdated[moves : moves + stops]:
            reason = (
                f"rollout {rollout.id}: max_unavailable {policy.max_unavailable} lets it stop "
                "before its replacement serves"
            )
            _stop(draft, replica, rollout, reason)
    serving_current = sum(1 for r in current if r.phase is ReplicaPhase.SERVING)
    left_behind = every and any(
        r.phase is not ReplicaPhase.STOPPING
        for r in _active(draft.state, model.name)
        if r.revision != revision
    )
    return serving_current >= target and not moving and not left_behind


def _available(replicas: list[Replica]) -> int:
    """Replicas that serve, a move's original and its serving replacement counted once."""
    serving = [r for r in replicas if r.phase in (ReplicaPhase.SERVING, ReplicaPhase.DRAINING)]
    doubled = {r.replaces for r in serving if r.replaces is not None}
    return sum(1 for r in serving if not (r.phase is ReplicaPhase.DRAINING and r.id in doubled))


def _active(state: ClusterState, model: str) -> list[Replica]:
    return [r for r in state.replicas.values() if r.model == model and r.phase in ACTIVE_PHASES]


def _stop(draft: Draft, replica: Replica, rollout: Rollout, reason: str) -> None:
    draft.emit(
        replica_stream(replica.id),
        ReplicaStopping(replica_id=replica.id, reason=reason),
        correlation_id=rollout.id,
    )
