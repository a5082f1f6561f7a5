"""Whether an operator's change since a pass decided makes the pass's run wrong to append:
``overtaken(state, events) -> stream | None`` (the reconciler asks it of each run)."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.decision import PlannedEvent
from app.domain.desired_count import counting, waiting_for_replacement
from app.domain.events import (
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaStopping,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.gpu_cordons import cordoned_indexes
from app.domain.state import ClusterState


def overtaken(state: ClusterState, events: Sequence[PlannedEvent]) -> str | None:
    """The stream of an operator's change that ``events`` (a pass's decision, or a run of
    it) now contradict, judged on ``state``: the log with them folded in; None when they
    still hold.

    A pass appends after it decided, and an operator's change recorded between the two
    (through any control plane) was not in what it decided on. The model's own stream is
    checked by version (nothing but operators and the leader write it); node and replica
    streams are not, since agents write them all the time. So the run is checked against
    what an operator decides on a node or model: a replica placed on a node cordoned or
    draining or on a GPU cordoned (nothing decided places there), for a model removed, or
    beyond its model's count (a pass places up to the count, never past it), and a replica
    stopped as surplus that leaves its model short of its count
    (``_surplus_stop_overtaken``), say the run was decided before the change and would undo
    it. So does a move the run starts (a move off
    an unhealthy GPU, a node drain's, a rollout's) of a replica an operator's drain reached
    first (``llmgw-cli drain --replica``): the fold keeps the first drain of a replica
    (``evolve.replicas``), so the replica's drain is not the run's; the operator's drain
    stands, and the next pass decides on it. So does a move of a replica that has stopped,
    ended or been forgotten since: the fold passes a drain of it over (``evolve.replicas``),
    and the run's replacement would be placed for nothing."""
    placed = [p.event for p in events if isinstance(p.event, ReplicaPlaced)]
    for event in placed:
        model = state.models.get(event.model)
        if model is None or model.removed:
            return model_stream(event.model)
        for shard in event.shards:
            node = state.nodes.get(shard.node_id)
            if node is None or node.cordoned or node.drain_id is not None:
                return node_stream(shard.node_id)
            if not cordoned_indexes(node).isdisjoint(shard.gpus):
                return node_stream(shard.node_id)
    for name in sorted({event.model for event in placed}):
        if counting(state, name) > state.models[name].desired:
            return model_stream(name)
    for planned in events:
        if isinstance(planned.event, ReplicaDrainStarted):
            moved = state.replicas.get(planned.event.replica_id)
            if moved is None or moved.drain_id != planned.event.drain_id:
                return replica_stream(planned.event.replica_id)
        if isinstance(planned.event, ReplicaStopping) and planned.event.surplus:
            short = _surplus_stop_overtaken(state, planned.event.replica_id)
            if short is not None:
                return short
    return None


def _surplus_stop_overtaken(state: ClusterState, replica_id: str) -> str | None:
    """The model's stream when the replica, stopped as surplus (its stop folded into
    ``state``), leaves its model short of the count it has now: a scale-up recorded since
    the pass decided the stop. A pass stops a replica that counts only down to the count,
    and a moved one (draining, serving until its replacement does) only while the
    replicas that count and the moves still waiting for a replacement make the count
    without it; a stop that goes below would be followed at once by a new placement, a dip
    in the model's capacity the operator never asked for."""
    replica = state.replicas.get(replica_id)
    model = state.models.get(replica.model) if replica is not None else None
    if replica is None or model is None:
        return None
    serving = counting(state, model.name)
    if replica.drain_id is not None:
        serving += len(waiting_for_replacement(state, model))
    return model_stream(model.name) if serving < model.desired else None
