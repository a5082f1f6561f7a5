"""What an operator asks of a model's rollout, and how it is going: pure decisions, no I/O.

``pause``, ``resume`` and ``undo`` return the ``Change`` to record on the model's stream, or
raise an ``OperationError`` an operator can act on; ``rollout_status`` answers "where is it"
from the state alone (the rollout is an entity of the fold, so its progress is a lookup).
The reconciler carries a rollout out (``app.domain.rollout``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
from msgspec.structs import replace

from app.domain.events import (
    ModelDeclared,
    RolloutPaused,
    RolloutResumed,
    RolloutStarted,
    model_stream,
)
from app.domain.free_text import reason_errors
from app.domain.keys import utc_text
from app.domain.model_operations import declared_model, find_model
from app.domain.model_spec import CanaryStep
from app.domain.move_views import MoveView, moves_of
from app.domain.operation_results import Change, InvalidOperation, InvalidText
from app.domain.revisions import (
    FIRST_REVISION,
    REVISION_FIELDS,
    next_revision,
    rollout_id_for,
    spec_changes,
)
from app.domain.rollout import rollback_event
from app.domain.rollout_convergence import active_replicas
from app.domain.state import (
    ClusterState,
    Model,
    Rollout,
    RolloutState,
)


def _rollout(model: Model) -> Rollout:
    if model.rollout is None:
        raise InvalidOperation(
            f"model {model.name} has had no rollout: it is at revision {model.revision}, "
            "and a spec change that alters what runs starts one"
        )
    return model.rollout


def pause(state: ClusterState, name: str, reason: str) -> Change:
    """Stop the rollout where it is: moves under way finish, no new one starts."""
    model = declared_model(state, name)
    rollout = _rollout(model)
    errors = reason_errors("reason", reason)
    if errors:
        raise InvalidText(f"the pause of rollout {rollout.id}", errors)
    if rollout.state is RolloutState.PAUSED:
        return Change(stream=model_stream(name))
    if rollout.state is not RolloutState.RUNNING:
        raise InvalidOperation(f"rollout {rollout.id} cannot be paused: {_why_not(rollout)}")
    said = reason or "paused by an operator"
    paused = RolloutPaused(model=name, rollout_id=rollout.id, reason=said)
    return Change(stream=model_stream(name), events=(paused,), correlation_id=rollout.id)


def resume(state: ClusterState, name: str) -> Change:
    """Go on from where it paused; a step whose verdict could not be reached is promoted."""
    model = declared_model(state, name)
    rollout = _rollout(model)
    if rollout.state is RolloutState.RUNNING:
        return Change(stream=model_stream(name))
    if rollout.state is not RolloutState.PAUSED:
        raise InvalidOperation(f"rollout {rollout.id} cannot be resumed: {_why_not(rollout)}")
    resumed = RolloutResumed(model=name, rollout_id=rollout.id)
    return Change(stream=model_stream(name), events=(resumed,), correlation_id=rollout.id)


def undo(state: ClusterState, name: str, rollout_id: str | None = None) -> Change:
    """Back to the revision before: a rollout under way is rolled back (its old replicas
    were never touched); after one that succeeded, the revision it came from is declared
    again as the next revision, and rolled out like any other.

    ``rollout_id`` names the rollout the operator means to undo. An undo after success
    starts a rollout of its own, so a repeat of it (a retried request, a second press)
    would find that rollout and roll the undo back; naming the rollout makes the repeat
    a refusal instead. None undoes the model's rollout, unless that one is itself an
    undo's: a repeat of an unnamed undo is refused too, and an undo of an undo is made only
    by naming it."""
    model = declared_model(state, name)
    rollout = _rollout(model)
    if rollout_id is not None and not _ever_a_rollout_of(model, rollout_id):
        raise InvalidOperation(
            f"rollout {rollout_id} cannot be undone: model {name} never had it (its rollouts "
            f"are named rollout-{name}-r<revision>, and its revisions go up to "
            f"{model.latest_revision}); the model's rollout is {_described(rollout)}; nothing "
            "was recorded"
        )
    if rollout_id is not None and rollout_id != rollout.id:
        raise InvalidOperation(
            f"rollout {rollout_id} cannot be undone: it is not the model's rollout any more "
            f"(undone or superseded already); the model's rollout is {_described(rollout)}; "
            "nothing was recorded"
        )
    if rollout_id is None and rollout.undoes is not None and rollout.state in _UNDOABLE:
        raise InvalidOperation(
            f"rollout {rollout.undoes} was undone already: the model's rollout is "
            f"{_described(rollout)}, the undo of {rollout.undoes}, and an undo that does not "
            "name its rollout does not undo an undo; nothing was recorded. To undo "
            f"{rollout.id} itself, name it (rollout_id {rollout.id}: llmgw-cli rollout undo "
            f"{name} --rollout {rollout.id}); to go on to another spec, declare it "
            "(llmgw-cli models apply)"
        )
    if rollout.state in (RolloutState.RUNNING, RolloutState.PAUSED):
        event = rollback_event(model, rollout, "undone by an operator")
        return Change(stream=model_stream(name), events=(event,), correlation_id=rollout.id)
    if rollout.state is RolloutState.SUCCEEDED:
        spec = replace(model.spec, **{f: getattr(rollout.from_spec, f) for f in REVISION_FIELDS})
        changes = spec_changes(model.spec, spec)
        if not changes:
            raise InvalidOperation(
                f"revision {rollout.from_revision} runs what revision {model.revision} runs; "
                "there is nothing to undo"
            )
        revision = next_revision(max(model.revision, model.latest_revision), changes)
        declared = ModelDeclared(model=name, spec=spec, revision=revision, changes=changes)
        started = RolloutStarted(
            model=name,
            rollout_id=rollout_id_for(name, revision),
            revision=revision,
            from_revision=model.revision,
            undoes=rollout.id,
        )
        return Change(
            stream=model_stream(name), events=(declared, started), correlation_id=started.rollout_id
        )
    raise InvalidOperation(f"rollout {rollout.id} cannot be undone: {_why_not(rollout)}")


def _ever_a_rollout_of(model: Model, rollout_id: str) -> bool:
    """Whether ``rollout_id`` names a rollout the model may have had: one of its own name and
    of a revision it reached after its first (a declaration starts no rollout)."""
    prefix = rollout_id_for(model.name, 0).removesuffix("0")
    number = rollout_id.removeprefix(prefix)
    if number == rollout_id or not number.isascii() or not number.isdigit():
        return False
    return rollout_id == rollout_id_for(model.name, int(number)) and (
        FIRST_REVISION < int(number) <= model.latest_revision
    )


_UNDOABLE = frozenset({RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.SUCCEEDED})


def _described(rollout: Rollout) -> str:
    now = rollout.state.value.replace("_", " ")
    return (
        f"{rollout.id}, revision {rollout.from_revision} -> {rollout.revision}, {now}, "
        f"started at {utc_text(rollout.started_at)}"
    )


def _why_not(rollout: Rollout) -> str:
    match rollout.state:
        case RolloutState.ROLLING_BACK:
            return f"it is already rolling back to revision {rollout.from_revision}"
        case RolloutState.ROLLED_BACK:
            # Its outcome says where it went back to, and why.
            return f"it was {rollout.outcome or f'rolled back to revision {rollout.from_revision}'}"
        case RolloutState.ENDED:
            return f"it ended: {rollout.outcome}"
        case RolloutState.SUCCEEDED:
            return f"it has finished ({rollout.outcome})"
        case _:
            return f"it is {rollout.state.value}"


# -- status ------------------------------------------------------------------------------


class RolloutStatus(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    rollout: Rollout
    steps: tuple[CanaryStep, ...]
    """The steps as they run (the implicit last step included)."""
    desired: int
    by_revision: dict[int, dict[str, int]]
    """Active replicas of each revision, by phase."""
    moves: tuple[MoveView, ...]
    hold_left_s: float | None
    """Seconds left of the current step's hold; None when it is not holding."""
    canary: tuple[int, float] | None
    """``(revision, share)`` the gateways send to the new revision now, if a share is set."""
    max_surge: int
    max_unavailable: int


def rollout_status(state: ClusterState, name: str, now: datetime) -> RolloutStatus:
    model = find_model(state, name)
    rollout = _rollout(model)
    replicas = active_replicas(state, name)
    by_revision: dict[int, dict[str, int]] = {}
    for replica in replicas:
        phases = by_revision.setdefault(replica.revision, {})
        phases[replica.phase.value] = phases.get(replica.phase.value, 0) + 1
    steps = model.spec.rollout.all_steps
    hold_left = None
    if rollout.holding_since is not None and rollout.state is RolloutState.RUNNING:
        step = steps[min(rollout.step, len(steps) - 1)]
        end = rollout.holding_since + timedelta(seconds=step.hold_s)
        hold_left = max((end - now).total_seconds(), 0.0)
    return RolloutStatus(
        model=name,
        rollout=rollout,
        steps=steps,
        desired=model.desired,
        by_revision=dict(sorted(by_revision.items())),
        moves=moves_of(state, rollout.id, model),
        hold_left_s=hold_left,
        canary=model.canary,
        max_surge=model.spec.rollout.max_surge,
        max_unavailable=model.spec.rollout.max_unavailable,
    )
