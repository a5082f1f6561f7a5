"""What an operator's request records, or why it is refused: pure decisions, no I/O.

Each decision takes the cluster as the log describes it and the request, and returns the
``Change`` to record: the events for the one stream it writes, none when the request
changes nothing (so a repeated request records nothing twice). A request that cannot be
carried out raises an ``OperationError`` whose message an operator can act on. The
questions operators ask about a model or a drain are answered here too, from the same
state.

OperationError
├── UnknownThing        no such model, node, replica or drain in the log (``key`` says which)
│   ├── UnknownModel
│   ├── UnknownNode
│   ├── UnknownReplica
│   └── UnknownDrain
├── InvalidSpec         the spec breaks the rules of ``validate_spec``; ``errors`` has them all
├── InvalidDrain        a drain's grace out of bounds (``errors`` says so)
├── InvalidText         a reason holding what the log cannot keep (``app.domain.free_text``)
└── InvalidOperation    the request does not fit the cluster as it is now
    └── NoRoomToDrain   a drain that requires room for every replica, and one has none
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TypeVar

import msgspec
from msgspec.structs import replace

from app.domain.drain import NODE_DRAIN_COMPLETE
from app.domain.drain_room import ReplicaRoom, room_for_drain
from app.domain.envelope import Recorded
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    NodeCordoned,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeUncordoned,
    ReplicaDrainStarted,
    RolloutFinished,
    RolloutStarted,
    model_stream,
    node_stream,
    replica_stream,
    subjects,
)
from app.domain.evolve import replay
from app.domain.free_text import reason_errors
from app.domain.model_spec import (
    AutoscalePolicy,
    ModelSpec,
    RoutingSettings,
    SpecError,
    validate_spec,
)
from app.domain.placement import Explanation, explain_placement
from app.domain.revisions import FIRST_REVISION, next_revision, rollout_id_for, spec_changes
from app.domain.state import (
    ACTIVE_PHASES,
    ENDED_PHASES,
    ClusterState,
    Model,
    Node,
    Replica,
    ReplicaFilter,
    ReplicaPhase,
)

MAX_DRAIN_GRACE_S = 7 * 24 * 3600
NO_ROOM_NAMED = 8
"""The replicas without room a refused drain's message names; the answer lists them all."""
NOT_SERVING_YET = frozenset({ReplicaPhase.PLACED, ReplicaPhase.STARTING})

_T = TypeVar("_T")


class OperationError(Exception):
    """Base of every refusal; the message is meant for the operator."""


class UnknownThing(OperationError):
    kind = "thing"

    def __init__(self, key: str) -> None:
        super().__init__(f"no {self.kind} {key!r} is known")
        self.key = key


class UnknownModel(UnknownThing):
    kind = "model"


class UnknownNode(UnknownThing):
    kind = "node"


class UnknownReplica(UnknownThing):
    kind = "replica"


class UnknownDrain(UnknownThing):
    kind = "drain"


class InvalidFields(OperationError):
    """A request whose fields break the rules; ``errors`` has every one, field and reason."""

    def __init__(self, what: str, errors: Sequence[SpecError]) -> None:
        listed = "; ".join(f"{e.field}: {e.reason}" for e in errors)
        super().__init__(f"{what} ({listed}); nothing was recorded")
        self.errors = list(errors)


class InvalidSpec(InvalidFields):
    def __init__(self, model: str, errors: Sequence[SpecError]) -> None:
        super().__init__(f"spec of model {model!r} is invalid", errors)


class InvalidDrain(InvalidFields):
    def __init__(self, node_id: str, errors: Sequence[SpecError]) -> None:
        super().__init__(f"drain of node {node_id!r} cannot be requested", errors)


class InvalidText(InvalidFields):
    def __init__(self, what: str, errors: Sequence[SpecError]) -> None:
        super().__init__(f"{what} cannot be recorded", errors)


class InvalidOperation(OperationError):
    pass


class NoRoomToDrain(InvalidOperation):
    """A drain asked to be refused rather than stop a replica it cannot move."""

    def __init__(self, node_id: str, room: Sequence[ReplicaRoom]) -> None:
        nowhere = [r for r in room if not r.has_room]
        listed = "; ".join(f"{r.replica_id}: {r.reason}" for r in nowhere[:NO_ROOM_NAMED])
        more = len(nowhere) - NO_ROOM_NAMED
        super().__init__(
            f"node {node_id} was not drained: {len(nowhere)} of {len(room)} replica(s) on it "
            f"have nowhere to go now ({listed}{f'; and {more} more' if more > 0 else ''}); "
            "nothing was recorded"
        )
        self.room = tuple(room)


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """Events to append to ``stream``, at the version of it the decision was made on."""

    stream: str
    events: tuple[AnyEvent, ...] = ()
    correlation_id: str | None = None
    """What the events are part of when the decision knows (a rollout they start or
    steer); None: the request that asked for them."""


class NodeDrain(Change, frozen=True, kw_only=True):
    """A node drain to record, and whether each replica on the node has somewhere to go."""

    drain_id: str
    room: tuple[ReplicaRoom, ...] = ()
    """Each replica the drain moves or stops, by model and number (``drain_room``)."""


# -- models ------------------------------------------------------------------------------


def apply_model(state: ClusterState, spec: ModelSpec) -> Change:
    """Declare ``spec``: nothing when the model is already declared exactly so.

    A spec that says nothing about routing (the defaults) keeps the routing the model has:
    re-applying the file a model was declared from must not undo what ``bench`` measured
    and recorded as ``ModelTuned``. Routing written in the spec replaces it.

    The first declaration is revision 1; a spec that changes what runs (``REVISION_FIELDS``)
    is the next revision, with what changed; any other change keeps the revision and takes
    effect at once. A model removed and declared again continues its count of revisions,
    compared with the spec it had when it was removed; a rollout it still had under way
    ends first, as a pass would have ended it."""
    errors = validate_spec(spec)
    if errors:
        raise InvalidSpec(spec.name, errors)
    known = state.models.get(spec.name)
    if known is None:
        declared = ModelDeclared(model=spec.name, spec=spec, revision=FIRST_REVISION)
        return Change(stream=model_stream(spec.name), events=(declared,))
    if not known.removed and spec.routing == RoutingSettings():
        spec = replace(spec, routing=known.spec.routing)
    if not known.removed and spec.autoscale is not None and known.spec.autoscale is not None:
        # The autoscaler owns the count: re-applying the file must not reset it.
        spec = replace(spec, replicas=known.spec.replicas)
    if not known.removed and known.spec == spec:
        return Change(stream=model_stream(spec.name))
    changes = spec_changes(known.spec, spec)
    revision = next_revision(max(known.revision, known.latest_revision), changes)
    if not changes:
        revision = known.revision
    declared = ModelDeclared(model=spec.name, spec=spec, revision=revision, changes=changes)
    if known.removed:
        return Change(stream=model_stream(spec.name), events=(*_ended(known), declared))
    if revision == known.revision:
        return Change(stream=model_stream(spec.name), events=(declared,))
    started = RolloutStarted(
        model=spec.name,
        rollout_id=rollout_id_for(spec.name, revision),
        revision=revision,
        from_revision=known.revision,
    )
    return Change(
        stream=model_stream(spec.name),
        events=(declared, started),
        correlation_id=started.rollout_id,
    )


def _ended(removed: Model) -> tuple[RolloutFinished, ...]:
    """The end of the rollout a removed model still has under way, as the reconciler's next
    pass would record it: declared again first, the model would carry that rollout on into
    its new revision."""
    rollout = removed.rollout
    if rollout is None or not rollout.under_way:
        return ()
    finished = RolloutFinished(
        model=removed.name,
        rollout_id=rollout.id,
        succeeded=False,
        outcome="the model was removed",  # the words of ``rollout.rollout_moves``
    )
    return (finished,)


def scale(state: ClusterState, name: str, replicas: int) -> Change:
    model = declared_model(state, name)
    policy = model.spec.autoscale
    if policy is not None:
        raise InvalidOperation(
            f"model {name} is autoscaled between {policy.min_replicas} and "
            f"{policy.max_replicas} replicas; change the bounds (llmgw-cli autoscale {name} "
            "--min N --max N) or turn autoscaling off (--off) first"
        )
    errors = [
        e for e in validate_spec(replace(model.spec, replicas=replicas)) if e.field == "replicas"
    ]
    if errors:
        raise InvalidSpec(name, errors)
    if replicas == model.spec.replicas:
        return Change(stream=model_stream(name))
    scaled = ModelScaled(model=name, replicas=replicas, previous=model.spec.replicas)
    return Change(stream=model_stream(name), events=(scaled,))


def set_autoscale(state: ClusterState, name: str, policy: AutoscalePolicy | None) -> Change:
    """Turn autoscaling on with ``policy`` (or change it), or off with None: the count stays
    what it is until the autoscaler changes it (or an operator does, once it is off). Not
    a revision: it changes no engine."""
    model = declared_model(state, name)
    spec = replace(model.spec, autoscale=policy)
    errors = validate_spec(spec)
    if errors:
        raise InvalidSpec(name, errors)
    if spec == model.spec:
        return Change(stream=model_stream(name))
    declared = ModelDeclared(model=name, spec=spec, revision=model.revision)
    return Change(stream=model_stream(name), events=(declared,))


def patch_autoscale(
    state: ClusterState, name: str, fields: Mapping[str, float | int | None]
) -> Change:
    """Change only ``fields`` of the model's policy (named as the policy is on the wire,
    ``min``, ``max``, ...), the others kept as the model has them, or at their defaults when
    it is not autoscaled yet; a field given as None goes back to its default. Merged here,
    on the state the change is appended on, so that two operators changing different fields
    at once both keep their change."""
    model = declared_model(state, name)
    merged = msgspec.to_builtins(model.spec.autoscale or AutoscalePolicy())
    for field, value in fields.items():
        if value is None:
            merged.pop(field, None)
        else:
            merged[field] = value
    return set_autoscale(state, name, msgspec.convert(merged, AutoscalePolicy))


def remove(state: ClusterState, name: str) -> Change:
    """Every replica of a removed model is stopped by the reconciler."""
    model = find_model(state, name)
    if model.removed:
        return Change(stream=model_stream(name))
    return Change(stream=model_stream(name), events=(ModelRemoved(model=name),))


def placement_of(state: ClusterState, name: str) -> Explanation:
    return explain_placement(state, find_model(state, name).spec)


def placement_dry_run(state: ClusterState, spec: ModelSpec) -> Explanation:
    errors = validate_spec(spec)
    if errors:
        raise InvalidSpec(spec.name, errors)
    return explain_placement(state, spec)


# -- nodes and replicas ------------------------------------------------------------------


def cordon(state: ClusterState, node_id: str, reason: str) -> Change:
    """No new replica is placed on a cordoned node; those on it keep running. A cordoned
    node cordoned again with another reason (not an empty one) records the new reason, so
    that its history says who changed it and why; the same reason again records nothing."""
    node = find_node(state, node_id)
    errors = reason_errors("reason", reason)
    if errors:
        raise InvalidText(f"the cordon of node {node_id!r}", errors)
    if node.drain_id is not None:
        # The drain keeps the node cordoned, under its own reason: recording nothing would
        # drop the operator's reason without a word, so the cordon is refused as uncordon is.
        kept = f", and its reason {reason!r} was not kept" if reason else ""
        raise InvalidOperation(
            f"node {node_id} is already cordoned by its drain (drain {node.drain_id}"
            f"{_drain_since(node)}): the cordon was not recorded{kept}; follow the drain at "
            f"/admin/v1/drains/{node.drain_id}"
        )
    if node.cordoned and (not reason or reason == node.cordon_reason):
        return Change(stream=node_stream(node_id))
    return Change(
        stream=node_stream(node_id), events=(NodeCordoned(node_id=node_id, reason=reason),)
    )


def uncordon(state: ClusterState, node_id: str) -> Change:
    node = find_node(state, node_id)
    if node.drain_id is not None:
        raise InvalidOperation(
            f"node {node_id} is draining (drain {node.drain_id}); it can be uncordoned once "
            "that drain has finished"
        )
    if not node.cordoned:
        return Change(stream=node_stream(node_id))
    return Change(stream=node_stream(node_id), events=(NodeUncordoned(node_id=node_id),))


def drain_node(
    state: ClusterState, node_id: str, drain_id: str, grace_s: float, *, require_room: bool = False
) -> NodeDrain:
    """Move every replica off the node (the reconciler carries it out, see ``drain``), and
    say which replicas have nowhere to go now (``drain_room``); with ``require_room``, such
    a replica refuses the drain (``NoRoomToDrain``) and nothing is recorded."""
    node = find_node(state, node_id)
    if not 0 < grace_s <= MAX_DRAIN_GRACE_S:
        reason = f"must be more than 0 and at most {MAX_DRAIN_GRACE_S} (a week)"
        raise InvalidDrain(node_id, [SpecError("grace_s", reason)])
    if node.drain_id is not None:
        raise InvalidOperation(
            f"node {node_id} is already draining (drain {node.drain_id}{_drain_since(node)}); "
            f"follow it at /admin/v1/drains/{node.drain_id}"
        )
    requested = NodeDrainRequested(node_id=node_id, drain_id=drain_id, grace_s=grace_s)
    room = room_for_drain(state, requested)
    if require_room and any(not r.has_room for r in room):
        raise NoRoomToDrain(node_id, room)
    return NodeDrain(stream=node_stream(node_id), events=(requested,), drain_id=drain_id, room=room)


def _drain_since(node: Node) -> str:
    return f" since {node.drain_requested_at:%Y-%m-%d %H:%M:%S}" if node.drain_requested_at else ""


def drain_replica(state: ClusterState, replica_id: str, drain_id: str) -> Change:
    """Move one serving replica: a replacement is placed, and it stops once that serves."""
    replica = find_replica(state, replica_id)
    if replica.phase is not ReplicaPhase.SERVING:
        raise InvalidOperation(
            f"replica {replica_id} cannot be drained: {_why_not_drainable(replica)}"
        )
    started = ReplicaDrainStarted(
        replica_id=replica_id, drain_id=drain_id, reason="drain of this replica requested"
    )
    return Change(stream=replica_stream(replica_id), events=(started,))


def _why_not_drainable(replica: Replica) -> str:
    if replica.phase is ReplicaPhase.DRAINING:
        return f"it is already draining (drain {replica.drain_id})"
    if replica.phase in NOT_SERVING_YET:
        return (
            f"it is {replica.phase.value} and not serving yet, so there is nothing to move; "
            "scale the model down to stop it"
        )
    if replica.phase is ReplicaPhase.STOPPING:
        return f"it is already stopping ({replica.end_reason or 'no reason recorded'})"
    return f"it has ended ({replica.phase.value}: {replica.end_reason or 'no reason recorded'})"


# -- lookups -----------------------------------------------------------------------------


def find_model(state: ClusterState, name: str) -> Model:
    return _known(state.models, name, UnknownModel)


def find_node(state: ClusterState, node_id: str) -> Node:
    return _known(state.nodes, node_id, UnknownNode)


def find_replica(state: ClusterState, replica_id: str) -> Replica:
    return _known(state.replicas, replica_id, UnknownReplica)


def _known(things: Mapping[str, _T], key: str, unknown: type[UnknownThing]) -> _T:
    thing = things.get(key)
    if thing is None:
        raise unknown(key)
    return thing


def declared_model(state: ClusterState, name: str) -> Model:
    model = find_model(state, name)
    if model.removed:
        raise InvalidOperation(f"model {name} was removed; apply its spec to declare it again")
    return model


def replicas_matching(
    state: ClusterState,
    model: str | None = None,
    node_id: str | None = None,
    phase: ReplicaPhase | None = None,
) -> list[Replica]:
    """Replicas of ``model``, with a shard on ``node_id``, in ``phase`` (each if given)."""
    among = ReplicaFilter(model=model, node_id=node_id, phase=phase)
    return sorted(filter(among.matches, state.replicas.values()), key=lambda r: (r.model, r.number))


def replica_from_events(replica_id: str, events: Iterable[Recorded]) -> Replica | None:
    """The replica as the fold had it after ``events``, every event about it: a replica's
    state depends on its own events alone, so a fold of them rebuilds one it forgot."""
    return replay(events).replicas.get(replica_id)


# -- model status ------------------------------------------------------------------------


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


def model_status(state: ClusterState, name: str, now: datetime) -> ModelStatus:
    model = find_model(state, name)
    replicas = [r for r in state.replicas.values() if r.model == name]
    phases = Counter(r.phase for r in replicas)
    phases.update({ReplicaPhase(phase): n for phase, n in model.forgotten.items()})
    serving = phases[ReplicaPhase.SERVING]
    counting = serving + sum(phases[p] for p in NOT_SERVING_YET)
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
                f"{model.failures} failed start(s) in a row"
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
        detail = f": {last.id} {last.phase.value}, {last.end_reason}" if last else ""
        reasons.append(f"{model.failures} failed start(s) in a row{detail}")
    return tuple(reasons)


# -- moves -------------------------------------------------------------------------------


class MoveView(msgspec.Struct, frozen=True, kw_only=True):
    """One move under way: the original, and its replacement once placed."""

    replica_id: str
    revision: int
    replacement_id: str | None
    replacement_phase: str | None
    waiting_for: str | None = None
    """Why no replacement is placed yet: the model's latest unplaceable reason (None once
    one is placed, or while placement has not said)."""


def moves_of(state: ClusterState, move_id: str, model: Model | None = None) -> tuple[MoveView, ...]:
    """The moves under way of a drain or a rollout (``move_id``), from the models' moves (a
    lookup: no scan of the replicas); of ``model`` alone when given."""
    models = [model] if model is not None else list(state.models.values())
    views: list[tuple[tuple[str, int], MoveView]] = []
    for each in models:
        for move in each.moves.values():
            original = state.replicas.get(move.replica_id)
            if move.move_id != move_id or original is None:
                continue
            replacement = (
                state.replicas.get(move.replacement_id) if move.replacement_id is not None else None
            )
            view = MoveView(
                replica_id=move.replica_id,
                revision=original.revision,
                replacement_id=replacement.id if replacement else None,
                replacement_phase=replacement.phase.value if replacement else None,
                waiting_for=None if replacement else each.unplaceable_reason,
            )
            views.append(((each.name, original.number), view))
    return tuple(view for _, view in sorted(views, key=lambda item: item[0]))


# -- drain progress ----------------------------------------------------------------------


class DrainState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """A node drain that moved every replica; a replica drain whose replicas were each
    replaced. A replica stopped because its model had its count without it was not
    needed: the node was emptied all the same."""
    FAILED = "failed"
    """The grace ran out and what was left was stopped, not moved; or a replica it was
    moving ended without a replacement otherwise (its agent shut down, its engine
    failed, a rollout's ``max_unavailable`` stopped it)."""


class DrainProgress(msgspec.Struct, frozen=True, kw_only=True):
    drain_id: str
    node_id: str | None
    """The drained node; None when one replica was drained on its own."""
    requested_by: str
    requested_at: datetime
    grace_s: float | None
    grace_ends_at: datetime | None
    """When what is still on the node is stopped rather than moved (a node drain with a
    grace); None for a replica drain, whose grace is the server's."""
    state: DrainState
    finished: bool
    outcome: str | None
    """What the drain came to, in words; None while it runs."""
    replicas: tuple[Replica, ...]
    """Replicas the drain moved, placed as replacements, or stopped."""
    still_on_node: tuple[str, ...]
    """Active replicas on the drained node that the drain has not reached yet."""
    events: tuple[Recorded, ...]
    revisions: dict[str, int] = {}
    """The current revision of each model of ``replicas``."""
    moves: tuple[MoveView, ...] = ()
    """Its moves under way (the same view a rollout's status has)."""


def drain_progress(state: ClusterState, drain_id: str, events: Sequence[Recorded]) -> DrainProgress:
    """How the drain is going, from its events (those carrying its id as correlation id):
    its first (the request) and, however long it ran, its newest, among which a node
    drain's finish is (the drain's node no longer drains after it, so nothing more is
    decided for the drain)."""
    if not events:
        raise UnknownDrain(drain_id)
    first = events[0]
    touched = {r.id for r in state.replicas.values() if r.drain_id == drain_id}
    # Its replacements too, whether or not the events shown name them.
    touched |= {r.id for r in state.replicas.values() if r.replaces in touched}
    touched |= {i for e in events if (i := subjects(e.event).replica) is not None}
    replicas = tuple(state.replicas[i] for i in sorted(touched) if i in state.replicas)
    requested = first.event
    if isinstance(requested, NodeDrainRequested):
        node_id: str | None = requested.node_id
        grace_s: float | None = requested.grace_s
        done = next((e.event for e in events if isinstance(e.event, NodeDrainFinished)), None)
        outcome = done.outcome if done is not None else None
        succeeded = done is not None and (
            done.succeeded if done.succeeded is not None else outcome == NODE_DRAIN_COMPLETE
        )
        still = tuple(
            r.id
            for r in replicas_matching(state, node_id=requested.node_id)
            if r.phase in ACTIVE_PHASES and r.id not in touched
        )
    else:
        node_id, grace_s, still = None, None, ()
        moved = [r for r in replicas if r.drain_id == drain_id]
        ended = bool(moved) and all(r.phase in ENDED_PHASES for r in moved)
        outcome = (
            "; ".join(f"{r.id} {r.end_reason or r.phase.value}" for r in moved) if ended else None
        )
        succeeded = all(r.replacement_id is not None or r.surplus for r in moved)
    if outcome is None:
        drain_state = DrainState.RUNNING
    else:
        drain_state = DrainState.SUCCEEDED if succeeded else DrainState.FAILED
    return DrainProgress(
        drain_id=drain_id,
        node_id=node_id,
        requested_by=first.meta.actor,
        requested_at=first.recorded_at,
        grace_s=grace_s,
        grace_ends_at=(
            first.recorded_at + timedelta(seconds=grace_s) if grace_s is not None else None
        ),
        state=drain_state,
        finished=outcome is not None,
        outcome=outcome,
        replicas=replicas,
        still_on_node=still,
        events=tuple(events),
        revisions=current_revisions(state, replicas),
        moves=moves_of(state, drain_id),
    )


def current_revisions(state: ClusterState, replicas: Iterable[Replica]) -> dict[str, int]:
    """The current revision of each model of ``replicas`` that the log knows."""
    return {
        r.model: model.revision
        for r in replicas
        if (model := state.models.get(r.model)) is not None
    }
