"""What every part of the fold does to change an entity: replace it in the state with some
of its fields changed (a ``*Changes`` dict of ``app.domain.changes``), or leave the state as it
is when the state does not know the entity; and ``rollout_in``, the rollout an event of one is
about, while its model is still in it and it has not finished."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgspec.structs import replace

from app.domain.changes import (
    GpuChanges,
    ModelChanges,
    NodeChanges,
    ReplicaChanges,
    RolloutChanges,
    ShardChanges,
)
from app.domain.envelope import Recorded
from app.domain.gpu_identity import same_gpu
from app.domain.state import ClusterState, Rollout

Handler = Callable[[ClusterState, Any, Recorded], None]
"""How one event changes the state: ``handler(state, event, recorded)``."""


def update_shard(
    state: ClusterState,
    replica_id: str,
    index: int,
    changes: ShardChanges,
    replica_changes: ReplicaChanges | None = None,
) -> None:
    if state.shard(replica_id, index) is None:
        return
    replica = state.replicas[replica_id]
    shards = list(replica.shards)
    shards[index] = replace(shards[index], **changes)
    state.replicas[replica_id] = replace(replica, shards=tuple(shards), **(replica_changes or {}))


def update_replica(state: ClusterState, replica_id: str, changes: ReplicaChanges) -> None:
    replica = state.replicas.get(replica_id)
    if replica is not None:
        state.replicas[replica_id] = replace(replica, **changes)


def update_model(state: ClusterState, name: str, changes: ModelChanges) -> None:
    model = state.models.get(name)
    if model is not None:
        state.models[name] = replace(model, **changes)


def rollout_in(state: ClusterState, name: str, rollout_id: str) -> Rollout | None:
    """The model's rollout if it is ``rollout_id`` and still under way; None for an event
    of an earlier one, now superseded, of one that has finished (a finished rollout stays
    as it finished: a pause, a resume or a step recorded late would start it again), or of
    a model the state does not know."""
    model = state.models.get(name)
    rollout = model.rollout if model else None
    if rollout is None or rollout.id != rollout_id or not rollout.under_way:
        return None
    return rollout


def update_rollout(
    state: ClusterState, name: str, rollout_id: str, changes: RolloutChanges
) -> None:
    """Change the model's rollout if it is ``rollout_id`` (an event of an earlier one, now
    superseded, changes nothing)."""
    rollout = rollout_in(state, name, rollout_id)
    if rollout is not None:
        state.models[name] = replace(state.models[name], rollout=replace(rollout, **changes))


def update_node(state: ClusterState, node_id: str, changes: NodeChanges) -> None:
    node = state.nodes.get(node_id)
    if node is not None:
        state.nodes[node_id] = replace(node, **changes)


def update_gpu(
    state: ClusterState, node_id: str, index: int, uuid: str, changes: GpuChanges
) -> None:
    """Change the node's GPU under ``index`` if it is the GPU with ``uuid``
    (``app.domain.gpu_identity``; an event recorded before GPU events named a UUID names
    none, and so the GPU under its index)."""
    node = state.nodes.get(node_id)
    if node is None:
        return
    gpus = tuple(
        replace(g, **changes) if g.index == index and same_gpu(g, index=index, uuid=uuid) else g
        for g in node.gpus
    )
    state.nodes[node_id] = replace(node, gpus=gpus)
