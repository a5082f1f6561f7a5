"""An operator calls a drain off. Pure, no I/O.

A node drain's cancellation is recorded on the node's stream (``node_drain_cancelled``, the
operator its actor); the reconciler's next pass calls off each of its moves under way and
finishes it as cancelled (``app.domain.drain``). A replica drain's is its one move called
off at once (``replica_drain_cancelled`` on the replica's stream): the replica serves and
counts again. Either way a replacement already placed is then beyond its model's count, and
the scale rule stops the newest such replica; an original already stopping stays stopped.

Cancelling a drain already called off records nothing (the answer says nothing changed); a
drain that ended otherwise is refused with how it ended.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from app.domain.drain_progress import DrainState, drain_progress
from app.domain.envelope import Recorded
from app.domain.events import (
    NodeDrainCancelled,
    NodeDrainRequested,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    RolloutStarted,
    node_stream,
    replica_stream,
)
from app.domain.operation_results import Change, InvalidOperation, UnknownDrain
from app.domain.state import ClusterState, ReplicaPhase


class DrainTarget(msgspec.Struct, frozen=True, kw_only=True):
    """The stream a drain's cancellation is recorded on, and the replica a replica drain
    moves (None for a node drain)."""

    stream: str
    replica_id: str | None = None


def drain_target(drain_id: str, events: Sequence[Recorded]) -> DrainTarget:
    """What ``drain_id`` drains, from its events (those correlated with it, oldest first):
    the first is its request. A rollout's id (its moves carry it as their drain id) is
    refused with how to steer the rollout; any other id is not a drain's."""
    match events[0].event if events else None:
        case NodeDrainRequested(node_id=node_id, drain_id=requested) if requested == drain_id:
            return DrainTarget(stream=node_stream(node_id))
        case ReplicaDrainStarted(replica_id=replica_id, drain_id=started) if started == drain_id:
            return DrainTarget(stream=replica_stream(replica_id), replica_id=replica_id)
        case _:
            rollout = next(
                (
                    e.event
                    for e in events
                    if isinstance(e.event, RolloutStarted) and e.event.rollout_id == drain_id
                ),
                None,
            )
            if rollout is not None:
                raise InvalidOperation(
                    f"{drain_id} is a rollout of model {rollout.model}, not a drain: its moves "
                    f"end with it; pause it (llmgw-cli rollout pause {rollout.model}) or undo "
                    f"it (llmgw-cli rollout undo {rollout.model})"
                )
            raise UnknownDrain(drain_id)


def cancel_drain(state: ClusterState, drain_id: str, events: Sequence[Recorded]) -> Change:
    """The drain's cancellation to record, nothing when it is called off already, or
    ``InvalidOperation`` for a drain that has ended otherwise."""
    target = drain_target(drain_id, events)
    match events[0].event:
        case NodeDrainRequested(node_id=node_id):
            node = state.nodes.get(node_id)
            if node is not None and node.drain_id == drain_id:
                if node.drain_cancelled_by is not None:
                    return Change(stream=target.stream)
                return Change(
                    stream=target.stream,
                    events=(NodeDrainCancelled(node_id=node_id, drain_id=drain_id),),
                )
        case ReplicaDrainStarted(replica_id=replica_id):
            replica = state.replicas.get(replica_id)
            if (
                replica is not None
                and replica.phase is ReplicaPhase.DRAINING
                and replica.drain_id == drain_id
            ):
                called_off = ReplicaDrainCancelled(
                    replica_id=replica_id,
                    drain_id=drain_id,
                    reason=f"drain {drain_id} was cancelled: it serves on",
                )
                return Change(stream=target.stream, events=(called_off,))
    progress = drain_progress(state, drain_id, events)
    if progress.state is DrainState.CANCELLED:
        return Change(stream=target.stream)
    ended = (
        f"it {progress.state.value}: {progress.outcome}"
        if progress.finished
        else "it is ending already (what it moved is stopping)"
    )
    raise InvalidOperation(
        f"drain {drain_id} cannot be cancelled: {ended} (llmgw-cli drain-progress {drain_id})"
    )
