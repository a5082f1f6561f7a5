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
  replicas they ejected during the hold as the log keeps them (``RolloutHoldEjectionSeen``,
  ``app.domain.hold_ejections``); the verdict (``RolloutVerdict``,
  ``app.domain.rollout_verdict``): promote to the next step, roll back, or pause for an
  operator when too few requests or latency samples were seen to tell;
- when every replica runs the new revision, finishes it (``RolloutFinished``).

A rollout rolled back (by a verdict, by failures, or by ``rollout undo``) is brought home
the same way: the model's revision is the old one again, so its replicas of the new one are
the ones replaced, and moves of old replicas it had started are called off. Everything the
reconciler decides here is an event with the rollout's id as correlation id, so a control
plane that restarts anywhere in a rollout resumes it from the log exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from msgspec.structs import replace

from app.domain.decision import Draft
from app.domain.events import (
    JudgedFigures,
    ReplicaDrainCancelled,
    RolloutFinished,
    RolloutHoldEjectionSeen,
    RolloutHolding,
    RolloutPaused,
    RolloutRolledBack,
    RolloutStepStarted,
    RolloutVerdict,
    model_stream,
)
from app.domain.model_spec import CanaryStep
from app.domain.revisions import REVISION_FIELDS
from app.domain.rollout_convergence import active_replicas, converge, record_on_replica
from app.domain.rollout_reads import (
    canary_group,
    none_to_judge_against,
    sides_ejected,
    stable_group,
)
from app.domain.rollout_verdict import (
    INCONCLUSIVE,
    PROMOTE,
    ROLL_BACK,
    Ejected,
    as_judged,
    judge,
)
from app.domain.state import (
    COUNTING_PHASES,
    ClusterState,
    Model,
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
    | RolloutHoldEjectionSeen
    | RolloutVerdict
    | RolloutPaused
    | RolloutRolledBack
    | RolloutFinished
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
        for replica in active_replicas(state, model.name)
        if replica.revision == model.revision and replica.phase in COUNTING_PHASES
    )
    return max(allowed - running, 0)


def rollout_moves(draft: Draft, traffic: Mapping[str, TrafficFigures]) -> None:
    """Advance every rollout under way by what the state and the gateways' figures say; a
    verdict counts the replicas the log says the gateways ejected during the hold
    (``Rollout.hold_ejections``, recorded by ``app.domain.hold_ejections``)."""
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
            _advance(draft, model, rollout, traffic)


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
    if not converge(draft, model, rollout, target, every=last):
        return
    if last:
        outcome = f"every replica runs revision {rollout.revision}"
        _finish(draft, model, rollout, succeeded=True, outcome=outcome)
        return
    if rollout.promoted or step.hold_s <= 0:
        _start_step(draft, model, rollout, index + 1, steps[index + 1])
        return
    if rollout.holding_since is None:
        record_on_model(
            draft,
            rollout,
            RolloutHolding(model=model.name, rollout_id=rollout.id, step=index, hold_s=step.hold_s),
        )
        return
    if draft.now < rollout.holding_since + timedelta(seconds=step.hold_s):
        return
    replicas = active_replicas(draft.state, model.name)
    sides = sides_ejected(replicas, model, rollout, rollout.hold_ejections)
    _judge(draft, model, rollout, index, traffic, sides, none_to_judge_against(model, replicas))


def record_on_model(draft: Draft, rollout: Rollout, event: RolloutEvent) -> None:
    """An event of the rollout, on its model's stream under the rollout's id."""
    draft.emit(model_stream(event.model), event, correlation_id=rollout.id)


def _start_step(draft: Draft, model: Model, rollout: Rollout, index: int, step: CanaryStep) -> None:
    replicas = step.count(model.desired)
    record_on_model(
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
    alone: str | None,
) -> None:
    """``alone``: why nothing of another revision is left to compare with, if so; an
    inconclusive verdict says that rather than that the others saw too few requests."""
    canary = traffic.get(canary_group(model.name))
    stable = traffic.get(stable_group(model.name))
    verdict, reason = judge(canary, stable, model.spec.rollout, ejected)
    if verdict == INCONCLUSIVE and alone is not None:
        reason = alone
    record_on_model(
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
        record_on_model(
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


def _judged(measured: TrafficFigures | None) -> JudgedFigures | None:
    figures = as_judged(measured)
    if measured is None or figures is None:
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
        abandoned=measured.abandoned,
    )


def _roll_back(draft: Draft, model: Model, rollout: Rollout, reason: str) -> None:
    record_on_model(draft, rollout, rollback_event(model, rollout, reason))
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
    for replica in active_replicas(draft.state, model.name):
        if (
            replica.phase is ReplicaPhase.DRAINING
            and replica.drain_id == rollout.id
            and replica.revision == model.revision
        ):
            record_on_replica(
                draft,
                rollout,
                ReplicaDrainCancelled(
                    replica_id=replica.id,
                    drain_id=rollout.id,
                    reason=f"rollout {rollout.id} rolled back: it runs revision {model.revision}",
                ),
            )
    model = draft.state.models[model.name]
    if converge(draft, model, rollout, model.desired, every=True):
        why = model.rollout.outcome if model.rollout is not None else None
        outcome = f"rolled back to revision {model.revision}: {why}"
        _finish(draft, model, rollout, succeeded=False, outcome=outcome)


def _finish(draft: Draft, model: Model, rollout: Rollout, *, succeeded: bool, outcome: str) -> None:
    record_on_model(
        draft,
        rollout,
        RolloutFinished(
            model=model.name, rollout_id=rollout.id, succeeded=succeeded, outcome=outcome
        ),
    )
