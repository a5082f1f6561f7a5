"""The fold of models: declared (a new revision keeps the specs its active replicas still
run), scaled (down: the places of replicas that ended unasked are no longer kept open),
removed, tuned and found unplaceable."""

from __future__ import annotations

from datetime import datetime

from msgspec.structs import replace

from app.domain.envelope import Recorded
from app.domain.events import (
    Event,
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    ModelTuned,
    ModelUnplaceable,
)
from app.domain.evolve.updates import Handler, update_model, update_replica
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.state import ACTIVE_PHASES, ClusterState, Model, RolloutState


def _model_declared(state: ClusterState, event: ModelDeclared, recorded: Recorded) -> None:
    at = recorded.recorded_at
    known = state.models.get(event.model)
    if known is None or known.removed:
        state.models[event.model] = Model(
            name=event.model,
            spec=event.spec,
            declared_at=at,
            replicas_created=known.replicas_created if known else 0,
            ended=known.ended if known else (),
            forgotten=known.forgotten if known else {},
            revision=event.revision,
            earlier_specs=earlier_specs(state, known, event.revision) if known else {},
            latest_revision=max(event.revision, known.latest_revision if known else 0),
            rollout=known.rollout if known else None,
        )
    elif event.revision != known.revision:
        # A new revision runs something else (the operator fixed the command, say): the
        # failures of the one before say nothing of it, and their backoff would hold its
        # first placement back for up to ``BACKOFF_CAP_S``. As a rollback starts over.
        state.models[event.model] = replace(
            _declared(state, known, event), failures=0, failed_on={}, backoff_until=None
        )
    else:
        state.models[event.model] = _declared(state, known, event)


def _declared(state: ClusterState, known: Model, event: ModelDeclared) -> Model:
    return replace(
        known,
        spec=event.spec,
        unreplaced_ends=_still_open(known, event.spec.replicas),
        revision=event.revision,
        earlier_specs=earlier_specs(state, known, event.revision),
        latest_revision=max(event.revision, known.latest_revision),
    )


def earlier_specs(state: ClusterState, known: Model, revision: int) -> dict[int, ModelSpec]:
    """The specs of revisions before ``revision`` that active replicas of ``known`` run,
    the one it replaces included, and the one a rollout under way comes from. One scan of
    the replicas per declaration (rare), never one per replica event."""
    rollout = known.rollout
    placing_from = (
        rollout is not None and rollout.state in _PLACING_FROM and revision == known.revision
    )
    if revision == known.revision and not known.earlier_specs and not placing_from:
        return {}
    specs = {**known.earlier_specs, known.revision: known.spec}
    in_use = {
        r.revision
        for r in state.replicas.values()
        if r.model == known.name and r.phase in ACTIVE_PHASES and r.revision != revision
    }
    if revision != known.revision:
        # The spec it replaces, for the rollout that follows (``RolloutStarted`` takes it).
        in_use.add(known.revision)
    elif rollout is not None and placing_from:
        # It places replicas beyond its step at the revision it comes from
        # (``app.domain.rollout.new_revision_room``), even when none of them runs now.
        specs.setdefault(rollout.from_revision, rollout.from_spec)
        in_use.add(rollout.from_revision)
    return {n: spec for n, spec in specs.items() if n in in_use and n != revision}


_PLACING_FROM = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})


def _model_scaled(state: ClusterState, event: ModelScaled, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    if model is not None:
        spec = replace(model.spec, replicas=event.replicas)
        unreplaced = _still_open(model, event.replicas)
        state.models[event.model] = replace(model, spec=spec, unreplaced_ends=unreplaced)


def _still_open(model: Model, replicas: int) -> tuple[str, ...]:
    """The places of replicas that ended unasked still to be taken once ``model`` is to
    have ``replicas``: none after a scale-down, which may have closed them (which ones, the
    fold cannot tell), so no later placement names a replica whose place went with it."""
    return model.unreplaced_ends if replicas >= model.spec.replicas else ()


def _model_removed(state: ClusterState, event: ModelRemoved, recorded: Recorded) -> None:
    update_model(state, event.model, {"removed": True})


def _model_tuned(state: ClusterState, event: ModelTuned, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _tune(state, event, at)


def _model_unplaceable(state: ClusterState, event: ModelUnplaceable, recorded: Recorded) -> None:
    update_model(state, event.model, {"unplaceable_reason": event.reason})


def _tune(state: ClusterState, event: ModelTuned, at: datetime) -> None:
    routing = RoutingSettings(
        weight=event.weight, target_waiting=event.target_waiting, kv_ceiling=event.kv_ceiling
    )
    if event.replica_id is not None:
        update_replica(state, event.replica_id, {"routing": routing})
        return
    model = state.models.get(event.model)
    if model is not None:
        # Bench measures the three above; the model's policy and its knobs stay as declared.
        routing = replace(
            model.spec.routing,
            weight=routing.weight,
            target_waiting=routing.target_waiting,
            kv_ceiling=routing.kv_ceiling,
        )
        spec = replace(model.spec, routing=routing)
        state.models[event.model] = replace(model, spec=spec, tuned_summary=dict(event.summary))


HANDLERS: dict[type[Event], Handler] = {
    ModelDeclared: _model_declared,
    ModelScaled: _model_scaled,
    ModelRemoved: _model_removed,
    ModelTuned: _model_tuned,
    ModelUnplaceable: _model_unplaceable,
}
"""The events this module folds, each with its handler."""
