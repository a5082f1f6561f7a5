"""Whether a node drain's replicas have somewhere to go: asked when the drain is
requested, so an operator learns it before the grace runs out and what is still on the
node is stopped, not moved.

It places each replica's replacement as the reconciler would
(``desired_count._place``), on the state the drain is decided on with the drain folded
in, and what the drain's first pass then does to the node's replicas, asked of the drain
itself (``drain.node_drain_steps``, every move at once): the node is cordoned (counted
as draining in the reasons), each serving replica on it is draining, each not serving yet is
stopping. So a replica of a rollout's new revision no longer counts in its step, and its
replacement runs the revision the reconciler will give it. Model by model in the fold's
order; within a model, the replacements of its moves by replica number (a move already
under way elsewhere goes before a later one of the node's), then a replica the drain stops
because it is not serving yet, which the model then places again: a move's replacement as
its original's, the others as many as the model is then short of. Each placement holds its
GPUs and port for the ones after it, so two replicas and room for one elsewhere means one
has no room. The replicas of other nodes being drained are moves under way, whether or not
the reconciler has started them yet: a second drain finds the room a first one will take
taken. What an engine a node reports running still holds is held as the reconciler
holds it (``Allocations.for_placement``). A replica with no room gets placement's reason, the line
``explain-placement`` gives.

What it cannot know: GPUs that free up or fail, nodes that join or leave, and a model
scaled meanwhile, before the reconciler places the replacements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from uuid import UUID

import msgspec

from app.domain.allocation import NOTHING_REPORTED, Allocations
from app.domain.desired_count import (
    counting,
    replacement_revisions,
    waiting_for_replacement,
)
from app.domain.drain import node_drain_steps
from app.domain.envelope import Meta, Recorded
from app.domain.events import AnyEvent, NodeDrainRequested, node_stream, replica_stream
from app.domain.evolve import evolve
from app.domain.placement import Placer
from app.domain.reports import NodeReport
from app.domain.state import NOT_SERVING_YET, ClusterState, Model, Replica, ReplicaPhase

NOT_READ = datetime(1970, 1, 1, tzinfo=UTC)
"""When the drain and its first steps are folded in: placement never reads it."""


class ReplicaRoom(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    model: str
    has_room: bool
    """Whether placement finds a place for its replacement now (or it has one already)."""
    reason: str | None = None
    """Why not, as placement says it (``explain-placement``); None when it has room."""


def room_for_drain(
    state: ClusterState,
    requested: NodeDrainRequested,
    running: Mapping[str, NodeReport] = NOTHING_REPORTED,
) -> tuple[ReplicaRoom, ...]:
    """For each replica on the node the drain moves or stops, whether its replacement finds
    a place now: model by model, in replica number order. ``running``: what each connected
    node reports running."""
    draining = _with_drain(state, requested)
    allocations = Allocations.for_placement(draining, running)
    rooms: list[ReplicaRoom] = []
    for model in list(draining.models.values()):
        on_node = [  # as they are before the drain
            r
            for r in state.replicas.values()
            if r.model == model.name and requested.node_id in r.node_ids
        ]
        if model.removed or not on_node:
            continue
        rooms.extend(_model_room(draining, model, on_node, allocations))
    return tuple(rooms)


def _model_room(
    state: ClusterState, model: Model, on_node: Sequence[Replica], allocations: Allocations
) -> list[ReplicaRoom]:
    """``state`` has the drain folded in; ``on_node`` are the model's replicas on the node
    as they were before it."""
    # The node's serving replicas, and the model's moves under way elsewhere too.
    moved = waiting_for_replacement(state, model)
    waiting_ids = {r.id for r in moved}
    counted = counting(state, model.name)
    # The drain stops the node's replicas not serving yet at once, as ``node_drain_steps`` does.
    stopped = sorted((r for r in on_node if r.phase in NOT_SERVING_YET), key=lambda r: r.number)
    # A stopped replacement is placed again as its original's; the others as the model's
    # missing replicas, as many as it misses (``desired_count.scale_to_desired``'s deficit).
    for_original = {r.id: r.replaces for r in stopped if r.replaces in waiting_ids}
    missing = max(0, model.desired - counted - len(moved))
    placed_again = [r for r in stopped if r.id not in for_original][:missing]
    revisions = replacement_revisions(state, model, [*moved, *(None for _ in placed_again)])
    groups: dict[int, list[Replica]] = {}
    for replica, revision in zip([*moved, *placed_again], revisions, strict=True):
        groups.setdefault(revision, []).append(replica)
    found: dict[str, str | None] = {}
    """Each replica placed for: None when its placement found a node, else the reason."""
    for revision, group in groups.items():  # as ``desired_count._place``: a placer per revision
        placer = Placer(state, model.spec_of(revision), allocations)
        for replica in group:
            placement = placer.place(f"replacement for {replica.id}")
            found[replica.id] = None if placement is not None else placer.summary()
    rooms = []
    for replica in sorted(on_node, key=lambda r: r.number):
        placed_for = for_original.get(replica.id) or replica.id
        if placed_for in found:
            reason = found[placed_for]
            room = ReplicaRoom(
                replica_id=replica.id, model=model.name, has_room=reason is None, reason=reason
            )
        elif replica.phase in NOT_SERVING_YET | {ReplicaPhase.DRAINING}:
            # Replaced already, or stopped with the model at its count: nothing to place.
            room = ReplicaRoom(replica_id=replica.id, model=model.name, has_room=True)
        else:
            continue
        rooms.append(room)
    return rooms


def _with_drain(state: ClusterState, requested: NodeDrainRequested) -> ClusterState:
    """A copy of ``state`` with the drain folded in as the log will hold it, and what the
    reconciler's first pass of it then does to the node's replicas
    (``drain.node_drain_steps``), every move started at once: a model's ``max_moves``
    paces them, but each waits for room the same. Before it, the same of every other node
    drain under way and not called off, so that their moves, the reconciler's pass of them
    made yet or not, hold the room they will take."""
    draining = state.copy()
    for other in list(draining.nodes.values()):
        # Drains requested before this one move first, the reconciler's pass made or not.
        if other.drain_id is not None and other.drain_cancelled_by is None:
            for replica_id, step in node_drain_steps(draining, other, paced=False):
                _fold(draining, replica_stream(replica_id), step, other.drain_id)
    _fold(draining, node_stream(requested.node_id), requested, requested.drain_id)
    node = draining.nodes.get(requested.node_id)
    if node is None:
        return draining
    for replica_id, step in node_drain_steps(draining, node, paced=False):
        _fold(draining, replica_stream(replica_id), step, requested.drain_id)
    return draining


def _fold(state: ClusterState, stream: str, event: AnyEvent, drain_id: str) -> None:
    evolve(
        state,
        Recorded(
            position=state.position,
            stream=stream,
            version=0,
            event_id=UUID(int=0),
            recorded_at=NOT_READ,
            meta=Meta(actor="drain-room", correlation_id=drain_id),
            event=event,
        ),
    )
