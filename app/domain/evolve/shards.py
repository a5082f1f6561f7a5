"""The fold of a replica's shards: an engine starting, ready, failed or stopped on its node,
and one adopted where an agent found it running. A shard's replica starts with its first
shard, and goes back to placed when its agent stops a shard on purpose. A shard that failed
because another process listens on its port marks that port held on its node
(``Node.ports_held_elsewhere``), for placement to skip.

A shard of a replica that has ended takes only the end of its engine, once: its agent
stops the engines of a failed or timed-out replica after the end, and says how each
ended (its exit code, its log's tail: why it never came up). A start, a ready or an
adoption of it recorded after the end, or a second end, is passed over, as the replica's
own late events are (``replicas``): the fold takes every log, so it refuses none. A port
held elsewhere that such a failure reports is still marked on its node: it is what the
node's agent found on that port, whatever became of the replica."""

from __future__ import annotations

from datetime import datetime

from app.domain.changes import ReplicaChanges, ShardChanges
from app.domain.envelope import Recorded
from app.domain.events import (
    Event,
    ReplicaAdopted,
    ShardFailed,
    ShardReady,
    ShardStarting,
    ShardStopped,
)
from app.domain.evolve.updates import Handler, update_node, update_shard
from app.domain.state import ClusterState, ReplicaPhase, ShardPhase


def _shard_starting(state: ClusterState, event: ShardStarting, recorded: Recorded) -> None:
    if _passed_over(state, event.replica_id, event.shard_index, ShardPhase.STARTING):
        return
    at = recorded.recorded_at
    changes: ShardChanges = {"phase": ShardPhase.STARTING, "pid": event.pid, "stop_reason": None}
    if _restarted(state, event) and recorded.meta.epoch is not None:
        # Restarted where it was placed, by the leader of this epoch: nothing to adopt.
        changes["epoch"] = recorded.meta.epoch
    update_shard(
        state,
        event.replica_id,
        event.shard_index,
        changes,
        replica_changes=_starting(state, event.replica_id, at),
    )


def _restarted(state: ClusterState, event: ShardStarting) -> bool:
    """Whether the shard starts again after its agent stopped it on purpose."""
    shard = state.shard(event.replica_id, event.shard_index)
    return shard is not None and shard.stopped_by_agent


def _shard_ready(state: ClusterState, event: ShardReady, recorded: Recorded) -> None:
    if _passed_over(state, event.replica_id, event.shard_index, ShardPhase.READY):
        return
    update_shard(
        state,
        event.replica_id,
        event.shard_index,
        {"phase": ShardPhase.READY, "came_up": True, "stop_reason": None},
    )


HELD_PORTS_KEPT = 64
"""Most ports a node keeps as held by another process (``Node.ports_held_elsewhere``): an
agent reporting every port of a wide range held cannot grow the state without bound."""


def _shard_failed(state: ClusterState, event: ShardFailed, recorded: Recorded) -> None:
    if event.port_held_elsewhere:
        _port_held(state, event)  # a fact about the node, whatever became of the shard
    if _passed_over(state, event.replica_id, event.shard_index, ShardPhase.FAILED):
        return
    update_shard(
        state,
        event.replica_id,
        event.shard_index,
        {
            "phase": ShardPhase.FAILED,
            "error": event.error,
            "exit_code": event.exit_code,
            "log_tail": event.log_tail,
            "stop_reason": None,
        },
    )


def _port_held(state: ClusterState, event: ShardFailed) -> None:
    """Remember the failed shard's port as held on its node, when the shard is the node's."""
    shard = state.shard(event.replica_id, event.shard_index)
    node = state.nodes.get(event.node_id)
    if shard is None or node is None or shard.node_id != node.id:
        return
    held = tuple(port for port in node.ports_held_elsewhere if port != shard.port)
    update_node(state, node.id, {"ports_held_elsewhere": (*held, shard.port)[-HELD_PORTS_KEPT:]})


def _shard_stopped(state: ClusterState, event: ShardStopped, recorded: Recorded) -> None:
    if _passed_over(state, event.replica_id, event.shard_index, ShardPhase.STOPPED):
        return
    changes: ShardChanges = {
        "phase": ShardPhase.STOPPED,
        "exit_code": event.exit_code,
        "stop_reason": event.reason,
    }
    if event.log_tail:  # an empty one keeps the tail an earlier failure reported
        changes["log_tail"] = event.log_tail
    replica_changes = (
        _stopped_by_agent(state, event.replica_id, recorded.recorded_at)
        if event.reason is not None
        else {}
    )
    update_shard(state, event.replica_id, event.shard_index, changes, replica_changes)


def _stopped_by_agent(state: ClusterState, replica_id: str, at: datetime) -> ReplicaChanges:
    """A replica starting or serving whose agent stops a shard on purpose goes back to
    placed: out of routing, its placement kept, to be started there again."""
    replica = state.replicas.get(replica_id)
    if replica is None or replica.phase not in (ReplicaPhase.STARTING, ReplicaPhase.SERVING):
        return {}
    return {
        "phase": ReplicaPhase.PLACED,
        "routable": False,
        "starting_since": None,
        "serving_since": None,
        "agent_stopped_at": at,
    }


def _replica_adopted(state: ClusterState, event: ReplicaAdopted, recorded: Recorded) -> None:
    at = recorded.recorded_at
    shard_phase = ShardPhase.READY if event.ready else ShardPhase.STARTING
    if _passed_over(state, event.replica_id, event.shard_index, shard_phase):
        return
    update_shard(
        state,
        event.replica_id,
        event.shard_index,
        {
            "node_id": event.node_id,
            "port": event.port,
            "pid": event.pid,
            "phase": shard_phase,
            # An engine that came up and is adopted while its agent re-checks it is still
            # the engine that came up.
            "came_up": event.ready or _came_up_there(state, event),
            "epoch": recorded.meta.epoch,
            "stop_reason": None,
        },
        replica_changes=_starting(state, event.replica_id, at),
    )


def _came_up_there(state: ClusterState, event: ReplicaAdopted) -> bool:
    shard = state.shard(event.replica_id, event.shard_index)
    if shard is None:
        return False
    return shard.came_up and (shard.node_id, shard.port) == (event.node_id, event.port)


def _starting(state: ClusterState, replica_id: str, at: datetime) -> ReplicaChanges:
    replica = state.replicas.get(replica_id)
    if replica is None or replica.phase is not ReplicaPhase.PLACED:
        return {}
    return {"phase": ReplicaPhase.STARTING, "starting_since": at}


def _passed_over(state: ClusterState, replica_id: str, index: int, phase: ShardPhase) -> bool:
    """Whether news that the shard is now in ``phase`` is passed over: its replica has
    ended, and the news would bring the shard back or end it a second time
    (``Replica.takes_shard_news``)."""
    shard = state.shard(replica_id, index)
    return shard is not None and not state.replicas[replica_id].takes_shard_news(shard, phase)


HANDLERS: dict[type[Event], Handler] = {
    ShardStarting: _shard_starting,
    ShardReady: _shard_ready,
    ShardFailed: _shard_failed,
    ShardStopped: _shard_stopped,
    ReplicaAdopted: _replica_adopted,
}
"""The events this module folds, each with its handler."""
