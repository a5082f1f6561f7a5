"""Whether a node drain's replicas have somewhere to go: asked when the drain is
requested, so an operator learns it before the grace runs out and what is still on the
node is stopped, not moved.

It places each replica's replacement as the reconciler would (``reconcile._place``), on
the state the drain is decided on with the drain folded in (so the node is cordoned, and
counted as draining in the reasons): model by model in the fold's order; within a model,
the replacements of its moves by replica number (a move already under way elsewhere goes
before a later one of the node's), then a replica the drain stops because it is not
serving yet, which the model then places again. Each placement holds its GPUs and port for
the ones after it, so two replicas and room for one elsewhere means one has no room. A
replica with no room gets placement's reason, the line ``explain-placement`` gives.

What it cannot know: GPUs that free up or fail, nodes that join or leave, and a model
scaled meanwhile, before the reconciler places the replacements.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

import msgspec

from app.domain.allocation import Allocations
from app.domain.envelope import Meta, Recorded
from app.domain.events import NodeDrainRequested, node_stream
from app.domain.evolve import evolve
from app.domain.placement import Placer
from app.domain.reconcile import replacement_revisions, waiting_for_replacement
from app.domain.state import ClusterState, Model, Replica, ReplicaPhase

PLACED_AGAIN = frozenset({ReplicaPhase.PLACED, ReplicaPhase.STARTING})
"""Replicas a node drain stops at once (nothing to move); their model places another."""
NOT_READ = datetime(1970, 1, 1, tzinfo=UTC)
"""When the drain is folded in as requested: placement never reads it."""


class ReplicaRoom(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    model: str
    has_room: bool
    """Whether placement finds a place for its replacement now (or it has one already)."""
    reason: str | None = None
    """Why not, as placement says it (``explain-placement``); None when it has room."""


def room_for_drain(state: ClusterState, requested: NodeDrainRequested) -> tuple[ReplicaRoom, ...]:
    """For each replica on the node the drain moves or stops, whether its replacement finds
    a place now: model by model, in replica number order."""
    draining = _with_drain(state, requested)
    allocations = Allocations.from_state(draining)
    rooms: list[ReplicaRoom] = []
    for model in list(draining.models.values()):
        on_node = [
            r
            for r in draining.replicas.values()
            if r.model == model.name and requested.node_id in r.node_ids
        ]
        if model.removed or not on_node:
            continue
        rooms.extend(_model_room(draining, model, on_node, allocations))
    return tuple(rooms)


def _model_room(
    state: ClusterState, model: Model, on_node: Sequence[Replica], allocations: Allocations
) -> list[ReplicaRoom]:
    ours = {r.id for r in on_node}
    waiting = waiting_for_replacement(state, model)  # the model's moves under way, too
    waiting_ids = {r.id for r in waiting}
    moved = sorted(
        [
            *waiting,
            *(r for r in on_node if r.phase is ReplicaPhase.SERVING and r.id not in waiting_ids),
        ],
        key=lambda r: r.number,
    )
    placed_again = sorted((r for r in on_node if r.phase in PLACED_AGAIN), key=lambda r: r.number)
    revisions = replacement_revisions(state, model, [*moved, *(None for _ in placed_again)])
    groups: dict[int, list[Replica]] = {}
    for replica, revision in zip([*moved, *placed_again], revisions, strict=True):
        groups.setdefault(revision, []).append(replica)
    rooms = {
        r.id: ReplicaRoom(replica_id=r.id, model=model.name, has_room=True)
        for r in on_node
        if r.phase is ReplicaPhase.DRAINING and r.id not in waiting_ids  # replaced already
    }
    for revision, group in groups.items():  # as ``reconcile._place``: a placer per revision
        placer = Placer(state, model.spec_of(revision), allocations)
        for replica in group:
            placement = placer.place(f"replacement for {replica.id}")
            if replica.id in ours:
                rooms[replica.id] = ReplicaRoom(
                    replica_id=replica.id,
                    model=model.name,
                    has_room=placement is not None,
                    reason=None if placement is not None else placer.summary(),
                )
    return [rooms[r.id] for r in sorted(on_node, key=lambda r: r.number) if r.id in rooms]


def _with_drain(state: ClusterState, requested: NodeDrainRequested) -> ClusterState:
    """A copy of ``state`` with the drain folded in as the log will hold it."""
    draining = state.copy()
    evolve(
        draining,
        Recorded(
            position=state.position,
            stream=node_stream(requested.node_id),
            version=0,
            event_id=UUID(int=0),
            recorded_at=NOT_READ,
            meta=Meta(actor="drain-room", correlation_id=requested.drain_id),
            event=requested,
        ),
    )
    return draining
