"""The fold of a model's rollout: started, each step started, held, judged, paused,
resumed, rolled back and finished. An event of a rollout the model is no longer in, or of
one that has finished, changes nothing (``updates.rollout_in``).

A rollout rolling back takes only its finish, as rolled back: a step, a hold, a verdict,
a pause, a resume, a second rollback or a finish as succeeded, recorded late, would stop
it bringing the old revision back (a paused or running rollout is no longer rolling back),
or set the model's spec once more to what it was when that rollback was decided. They
change nothing, as the late events of a finished rollout do."""

from __future__ import annotations

from msgspec.structs import replace

from app.domain.changes import RolloutChanges
from app.domain.envelope import Recorded
from app.domain.events import (
    Event,
    RolloutFinished,
    RolloutHoldEjectionSeen,
    RolloutHolding,
    RolloutPaused,
    RolloutResumed,
    RolloutRolledBack,
    RolloutStarted,
    RolloutStepStarted,
    RolloutVerdict,
)
from app.domain.evolve.models import earlier_specs
from app.domain.evolve.updates import Handler, rollout_in, update_rollout
from app.domain.state import ClusterState, Rollout, RolloutState

_STEERED = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})
"""Where a rollout is steered by its steps, verdicts, pauses and resumes, and may be rolled
back: under way, and not rolling back already."""


def _steered(state: ClusterState, name: str, rollout_id: str) -> Rollout | None:
    """The model's rollout if it is ``rollout_id`` and running or paused; None otherwise."""
    rollout = rollout_in(state, name, rollout_id)
    return rollout if rollout is not None and rollout.state in _STEERED else None


def _steer(state: ClusterState, name: str, rollout_id: str, changes: RolloutChanges) -> None:
    """Change the model's rollout if it is ``rollout_id``, running or paused."""
    if _steered(state, name, rollout_id) is not None:
        update_rollout(state, name, rollout_id, changes)


def _rollout_started(state: ClusterState, event: RolloutStarted, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    if model is None:
        return
    # A rollout still under way is superseded: the log says so (this event), and the model
    # keeps only the one it is now in.
    rollout = Rollout(
        id=event.rollout_id,
        revision=event.revision,
        from_revision=event.from_revision,
        from_spec=model.earlier_specs.get(event.from_revision, model.spec),
        started_at=recorded.recorded_at,
        undoes=event.undoes,
    )
    state.models[event.model] = replace(model, rollout=rollout)


def _rollout_step_started(
    state: ClusterState, event: RolloutStepStarted, recorded: Recorded
) -> None:
    _steer(
        state,
        event.model,
        event.rollout_id,
        {
            "step": event.step,
            "step_started_at": recorded.recorded_at,
            "holding_since": None,
            "hold_ejections": {},
            "promoted": False,
            "paused_by_verdict": False,
        },
    )


def _rollout_holding(state: ClusterState, event: RolloutHolding, recorded: Recorded) -> None:
    _steer(
        state,
        event.model,
        event.rollout_id,
        {"holding_since": recorded.recorded_at, "hold_ejections": {}},
    )


def _rollout_hold_ejection_seen(
    state: ClusterState, event: RolloutHoldEjectionSeen, recorded: Recorded
) -> None:
    rollout = _steered(state, event.model, event.rollout_id)
    replica = state.replicas.get(event.replica_id)
    # Only for the hold it was seen in, and a replica of the model: the ejections kept are
    # as many as the model's replicas, whatever the event says.
    if (
        rollout is None
        or rollout.step != event.step
        or rollout.holding_since is None
        or replica is None
        or replica.model != event.model
        or event.gateways <= rollout.hold_ejections.get(event.replica_id, 0)
    ):
        return
    ejections = {**rollout.hold_ejections, event.replica_id: event.gateways}
    update_rollout(state, event.model, event.rollout_id, {"hold_ejections": ejections})


def _rollout_verdict(state: ClusterState, event: RolloutVerdict, recorded: Recorded) -> None:
    _steer(
        state,
        event.model,
        event.rollout_id,
        {
            "promoted": event.verdict == "promote",
            "paused_by_verdict": event.verdict == "inconclusive",
            "verdict": f"{event.verdict}: {event.reason}",
        },
    )


def _rollout_paused(state: ClusterState, event: RolloutPaused, recorded: Recorded) -> None:
    _steer(
        state,
        event.model,
        event.rollout_id,
        {"state": RolloutState.PAUSED, "pause_reason": event.reason},
    )


def _rollout_resumed(state: ClusterState, event: RolloutResumed, recorded: Recorded) -> None:
    rollout = _steered(state, event.model, event.rollout_id)
    if rollout is None:
        return
    # Only a step whose verdict could not be reached is promoted by the operator's word. A
    # step the operator paused is judged on the next pass as usual: at once, on the
    # gateways' figures, if its hold ran out during the pause.
    update_rollout(
        state,
        event.model,
        event.rollout_id,
        {
            "state": RolloutState.RUNNING,
            "pause_reason": None,
            "promoted": rollout.promoted or rollout.paused_by_verdict,
        },
    )


def _rollout_rolled_back(state: ClusterState, event: RolloutRolledBack, recorded: Recorded) -> None:
    rollout = _steered(state, event.model, event.rollout_id)
    if rollout is None:
        return
    model = state.models[event.model]
    rolled_back = replace(
        rollout, state=RolloutState.ROLLING_BACK, outcome=event.reason, pause_reason=None
    )
    state.models[event.model] = replace(
        model,
        spec=event.spec,
        revision=event.to_revision,
        earlier_specs=earlier_specs(state, model, event.to_revision),
        failures=0,
        failed_on={},
        backoff_until=None,
        rollout=rolled_back,
    )


def _rollout_finished(state: ClusterState, event: RolloutFinished, recorded: Recorded) -> None:
    rollout = rollout_in(state, event.model, event.rollout_id)
    if rollout is None or (event.succeeded and rollout.state is RolloutState.ROLLING_BACK):
        return  # a rollout rolling back never succeeds: it finishes as rolled back
    if event.succeeded:
        ended = RolloutState.SUCCEEDED
    elif rollout.state is RolloutState.ROLLING_BACK:
        ended = RolloutState.ROLLED_BACK
    else:
        ended = RolloutState.ENDED
    update_rollout(
        state,
        event.model,
        event.rollout_id,
        {"state": ended, "finished_at": recorded.recorded_at, "outcome": event.outcome},
    )


HANDLERS: dict[type[Event], Handler] = {
    RolloutStarted: _rollout_started,
    RolloutStepStarted: _rollout_step_started,
    RolloutHolding: _rollout_holding,
    RolloutHoldEjectionSeen: _rollout_hold_ejection_seen,
    RolloutVerdict: _rollout_verdict,
    RolloutPaused: _rollout_paused,
    RolloutResumed: _rollout_resumed,
    RolloutRolledBack: _rollout_rolled_back,
    RolloutFinished: _rollout_finished,
}
"""The events this module folds, each with its handler."""
