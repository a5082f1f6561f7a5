"""How a drain is going, from its events and the state: running, succeeded or failed, the
replicas it moved and those still on the node. Pure, no I/O.

A drain is requested in ``node_operations`` and carried out by the reconciler
(``app.domain.drain``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum

import msgspec

from app.domain.drain import NODE_DRAIN_COMPLETE
from app.domain.envelope import Recorded
from app.domain.events import (
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    ReplicaDrainCancelled,
    subjects,
)
from app.domain.move_views import MoveView, moves_of
from app.domain.node_operations import replicas_matching
from app.domain.operation_results import UnknownDrain
from app.domain.state import ACTIVE_PHASES, ENDED_PHASES, ClusterState, Replica


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
    CANCELLED = "cancelled"
    """An operator called it off (``drain_cancel``): its moves under way were called off,
    and what it had moved stays moved."""


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
    """Active replicas on the drained node that the drain is not moving off: those it has
    not reached yet and those whose move was called off (``moves_called_off``). Each
    still serves there, or will, as before the drain."""
    moves_called_off: tuple[str, ...] = ()
    """Those of ``still_on_node`` whose move the drain began and then called off (the
    drain was cancelled, say): they are among ``replicas`` too, and serve on the node."""
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
    cancelled = False
    if isinstance(requested, NodeDrainRequested):
        node_id: str | None = requested.node_id
        grace_s: float | None = requested.grace_s
        end = next((e for e in events if isinstance(e.event, NodeDrainFinished)), None)
        done = end.event if end is not None and isinstance(end.event, NodeDrainFinished) else None
        outcome = done.outcome if done is not None else None
        succeeded = done is not None and (
            done.succeeded if done.succeeded is not None else outcome == NODE_DRAIN_COMPLETE
        )
        # Called off if the cancellation came before the end (one after it changed nothing).
        cancelled = end is not None and any(
            isinstance(e.event, NodeDrainCancelled) and e.position < end.position for e in events
        )
        # A replica whose move was called off is the drain's too, yet it serves on the node
        # as one never reached does: "still on the node" would be false without it. (One
        # the drain moves again is not.)
        moves_off = {
            e.event.replica_id
            for e in events
            if isinstance(e.event, ReplicaDrainCancelled)
            and e.event.drain_id == drain_id
            and (replica := state.replicas.get(e.event.replica_id)) is not None
            and replica.drain_id != drain_id
        }
        staying = [
            r
            for r in replicas_matching(state, node_id=requested.node_id)
            if r.phase in ACTIVE_PHASES and (r.id not in touched or r.id in moves_off)
        ]
        still = tuple(r.id for r in staying)
        moves_called_off = tuple(r.id for r in staying if r.id in moves_off)
    else:
        node_id, grace_s, still, moves_called_off = None, None, (), ()
        moved = [r for r in replicas if r.drain_id == drain_id]
        ended = bool(moved) and all(r.phase in ENDED_PHASES for r in moved)
        outcome = (
            "; ".join(f"{r.id} {r.end_reason or r.phase.value}" for r in moved) if ended else None
        )
        succeeded = all(r.replacement_id is not None or r.surplus for r in moved)
        called_off = next((e for e in events if isinstance(e.event, ReplicaDrainCancelled)), None)
        if called_off is not None and not moved:
            cancelled, outcome = True, f"cancelled by {called_off.meta.actor}"
    if outcome is None:
        drain_state = DrainState.RUNNING
    elif cancelled:
        drain_state = DrainState.CANCELLED
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
        moves_called_off=moves_called_off,
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
