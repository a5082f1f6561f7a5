"""Rule 10 of ``reconcile.decide``: each model is brought to its desired count, placing
the replicas it misses (the replacements of moved replicas first; any other names the
replica that ended unasked whose place it takes) or stopping the newest beyond it; and
what that count is made of: the replicas that count towards it, the moves still waiting
for a replacement, and the revision each replica placed towards it runs (``drain_room``
and ``overtaken`` judge by the same)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.allocation import Allocations
from app.domain.decision import Draft
from app.domain.events import (
    ModelUnplaceable,
    ReplicaPlaced,
    ReplicaStopping,
    model_stream,
    replica_id_for,
    replica_stream,
)
from app.domain.placement import Placer
from app.domain.reports import NodeReport
from app.domain.rollout import new_revision_room
from app.domain.state import (
    ACTIVE_PHASES,
    COUNTING_PHASES,
    ClusterState,
    Model,
    Replica,
    ReplicaPhase,
    RolloutState,
)


def counting(state: ClusterState, model_name: str) -> int:
    return sum(
        1 for r in state.replicas.values() if r.model == model_name and r.phase in COUNTING_PHASES
    )


def scale_to_desired(draft: Draft, *, placing: bool, running: Mapping[str, NodeReport]) -> None:
    """``running``: what each connected node reports running; what its engines hold is not
    placed on (``Allocations.for_placement``)."""
    state = draft.state
    allocations: Allocations | None = None
    by_model: dict[str, list[Replica]] = {}
    for replica in state.replicas.values():
        if replica.phase in ACTIVE_PHASES:
            by_model.setdefault(replica.model, []).append(replica)
    for model in list(state.models.values()):
        replicas = by_model.get(model.name, [])
        if model.removed:
            for replica in replicas:
                if replica.phase is not ReplicaPhase.STOPPING:
                    stop_replica(draft, replica, "model removed")
            continue
        counting = [r for r in replicas if r.phase in COUNTING_PHASES]
        deficit = model.desired - len(counting)
        if deficit < 0:
            for replica in _scale_down_order(state, model, counting)[:-deficit]:
                stop_replica(draft, replica, _surplus_reason(state, model, replica), surplus=True)
        # A moved replica whose replacement the count now leaves no room for goes with the
        # scale-down: its move would otherwise wait for a replacement never placed.
        for original in waiting_for_replacement(state, state.models[model.name])[max(deficit, 0) :]:
            stop_replica(draft, original, f"scaled down to {model.desired}", surplus=True)
        if deficit > 0 and placing:
            if model.backoff_until is not None and draft.now < model.backoff_until:
                continue
            if allocations is None:
                allocations = Allocations.for_placement(state, running)
            _place(draft, model, deficit, replicas, allocations)


def _place(
    draft: Draft, model: Model, deficit: int, replicas: list[Replica], allocations: Allocations
) -> None:
    """Place ``deficit`` replicas, the replacements of moved replicas first (in the order
    ``waiting_for_replacement`` gives), each running the revision ``replacement_revisions``
    gives. (``drain_room`` places a node drain's replacements in this same order.)"""
    state = draft.state
    waiting = waiting_for_replacement(state, model)
    originals = [waiting.pop(0) if waiting else None for _ in range(deficit)]
    planned: dict[int, list[Replica | None]] = {}
    for original, revision in zip(
        originals, replacement_revisions(state, model, originals), strict=True
    ):
        planned.setdefault(revision, []).append(original)
    have = model.desired - deficit
    for revision, group in planned.items():
        if not _place_at(draft, model, revision, group, allocations, have):
            return
        have += len(group)


def waiting_for_replacement(state: ClusterState, model: Model) -> list[Replica]:
    """The originals of ``model``'s moves whose replacement is neither on its way nor
    serving, in the order their replacements are placed: by replica number."""
    return sorted(
        (
            original
            for move in model.moves.values()
            if (original := state.replicas.get(move.replica_id)) is not None
            and original.phase is ReplicaPhase.DRAINING
            and not _replaced(state, move.replacement_id)
        ),
        key=lambda r: r.number,
    )


def replacement_revisions(
    state: ClusterState, model: Model, originals: Sequence[Replica | None]
) -> list[int]:
    """The revision each replica placed for ``originals`` (in that order; the replica it
    replaces, or None) runs: the model's, unless a rollout's step has no room for one more
    of it (``new_revision_room``): then the revision the rollout comes from. The
    replacement in a move of the rollout itself is the step's own, and runs the new one."""
    room = new_revision_room(state, model)
    revisions = []
    for original in originals:
        revision = model.revision
        if room is not None and model.rollout is not None:
            if room > 0 or (original is not None and original.drain_id == model.rollout.id):
                room -= 1
            else:
                revision = model.rollout.from_revision
        revisions.append(revision)
    return revisions


def _place_at(
    draft: Draft,
    model: Model,
    revision: int,
    originals: list[Replica | None],
    allocations: Allocations,
    have: int,
) -> bool:
    """Place a replica of ``revision`` for each of ``originals`` (the replica it replaces,
    or None), the model having ``have`` replicas that count; False when one found no node
    (recorded once, as the model's reason, with every replica still missing)."""
    state = draft.state
    spec = model.spec_of(revision)
    placer = Placer(state, spec, allocations)
    for placed, original in enumerate(originals):
        number = state.models[model.name].replicas_created + 1
        replica_id = replica_id_for(model.name, number)
        placement = placer.place(replica_id)
        if placement is None:
            reason = placer.summary()
            if state.models[model.name].unplaceable_reason != reason:
                missing = model.desired - have - placed
                draft.emit(
                    model_stream(model.name),
                    ModelUnplaceable(model=model.name, reason=reason, missing_replicas=missing),
                )
            return False
        reason = (
            f"replacement for {original.id} (drain {original.drain_id})"
            if original
            else _taking_over(state, state.models[model.name])
            + f"below desired count ({have + placed} of {model.desired})"
        )
        if revision != model.revision:
            reason += f", at revision {revision}: the rollout's step runs revision "
            reason += f"{model.revision} on no more replicas"
        draft.emit(
            replica_stream(replica_id),
            ReplicaPlaced(
                replica_id=replica_id,
                model=model.name,
                number=number,
                shards=placement,
                reason=reason,
                replaces=original.id if original else None,
                revision=revision,
            ),
            expected_version=0,
            correlation_id=original.drain_id if original else None,
        )
    return True


_UNASKED_END_WORDS = {
    ReplicaPhase.FAILED: "failed",
    ReplicaPhase.TIMED_OUT: "timed out starting",
    ReplicaPhase.LOST: "was lost",
}


def _taking_over(state: ClusterState, model: Model) -> str:
    """What a placement below the desired count says of the replica whose place it takes:
    the earliest that ended unasked and whose place no placement took yet (the fold gives
    that place to the placement: ``Model.unreplaced_ends``), or nothing."""
    if not model.unreplaced_ends:
        return ""
    ended = state.replicas.get(model.unreplaced_ends[0])
    if ended is None:
        return f"replaces {model.unreplaced_ends[0]}, "
    if ended.end_told_whole:
        return f"replaces {ended.id}, which {ended.end_told_whole}, "
    how = _UNASKED_END_WORDS.get(ended.phase, ended.phase.value)
    why = f" ({ended.end_reason})" if ended.end_reason else ""
    return f"replaces {ended.id}, which {how}{why}, "


def _replaced(state: ClusterState, replacement_id: str | None) -> bool:
    """Whether a move's replacement is on its way or serving."""
    replacement = state.replicas.get(replacement_id) if replacement_id is not None else None
    return replacement is not None and replacement.phase in COUNTING_PHASES


def _surplus_reason(state: ClusterState, model: Model, replica: Replica) -> str:
    """Why ``replica`` is beyond its model's count. A replacement whose original counts
    again had its move called off (a drain cancelled, say): nobody scaled the model down,
    and its history should not say so."""
    original = state.replicas.get(replica.replaces) if replica.replaces else None
    if original is not None and original.phase in COUNTING_PHASES:
        return (
            f"replacement for {original.id} no longer needed: its move was called off and "
            f"{original.id} serves on"
        )
    return f"scaled down to {model.desired}"


def stop_replica(draft: Draft, replica: Replica, reason: str, *, surplus: bool = False) -> None:
    draft.emit(
        replica_stream(replica.id),
        ReplicaStopping(replica_id=replica.id, reason=reason, surplus=surplus),
        correlation_id=replica.drain_id,
    )


def _scale_down_order(state: ClusterState, model: Model, replicas: list[Replica]) -> list[Replica]:
    """The newest that is not serving yet, then the newest serving. During a rollout's
    step (running or paused, the last one too), the replicas of the new revision go after
    the others: scaled down, the model keeps its canary (the step's count shrinks with the
    model only below it), even when the count comes down to the step's own, where the step
    no longer limits what is placed (``new_revision_room`` is None)."""
    rollout = model.rollout
    stepping = (
        rollout is not None
        and rollout.state in (RolloutState.RUNNING, RolloutState.PAUSED)
        and rollout.revision == model.revision
    )
    if not stepping:
        return sorted(replicas, key=lambda r: (r.phase is ReplicaPhase.SERVING, -r.number))
    return sorted(
        replicas,
        key=lambda r: (
            r.phase is ReplicaPhase.SERVING,
            r.revision == model.revision,
            -r.number,
        ),
    )
