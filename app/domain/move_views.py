"""The moves under way of a drain or a rollout, as their status shows them: each original
and its replacement once placed. Pure, a lookup in the models' moves."""

from __future__ import annotations

import msgspec

from app.domain.state import ClusterState, Model


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
