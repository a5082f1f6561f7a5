"""What an operator asks of a node or a replica: cordon, uncordon (the node or one of its
GPUs), drain. Pure decisions,
no I/O, with the lookups of nodes and replicas they and the admin API use.

Each returns the ``Change`` to record on the node's (or the replica's) stream, none when
the request changes nothing, or raises an ``OperationError``
(``app.domain.operation_results``). A drain's request is decided here, and what room each
replica on the node has (``drain_room``); the reconciler carries the drain out
(``app.domain.drain``), and how it goes is ``drain_progress``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.domain.allocation import NOTHING_REPORTED
from app.domain.drain_room import ReplicaRoom, room_for_drain
from app.domain.envelope import Recorded
from app.domain.events import (
    GpuCordoned,
    GpuInfo,
    GpuUncordoned,
    NodeCordoned,
    NodeDrainRequested,
    NodeUncordoned,
    ReplicaDrainStarted,
    node_stream,
    replica_stream,
)
from app.domain.evolve import replay
from app.domain.free_text import reason_errors
from app.domain.gpu_cordons import MAX_GPU_CORDONS, cordon_of, unlisted_cordons
from app.domain.gpu_identity import NumberedGpu
from app.domain.model_spec import SpecError
from app.domain.operation_results import (
    Change,
    InvalidDrain,
    InvalidOperation,
    InvalidText,
    NoRoomToDrain,
    UnknownNode,
    UnknownReplica,
    find_known,
)
from app.domain.reports import NodeReport
from app.domain.state import (
    NOT_SERVING_YET,
    ClusterState,
    Node,
    Replica,
    ReplicaFilter,
    ReplicaPhase,
)

MAX_DRAIN_GRACE_S = 7 * 24 * 3600


class NodeDrain(Change, frozen=True, kw_only=True):
    """A node drain to record, and whether each replica on the node has somewhere to go."""

    drain_id: str
    room: tuple[ReplicaRoom, ...] = ()
    """Each replica the drain moves or stops, by model and number (``drain_room``)."""
    drains_beside: frozenset[str] | None = None
    """For a drain that requires room: the other node drains the room was found beside
    (``room_overtaken``); None otherwise."""


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
            f"{_drain_since(node)}): the cordon was not recorded{kept}; "
            f"{_follow_or_cancel(node.drain_id)}"
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
            f"node {node_id} is draining (drain {node.drain_id}{_drain_since(node)}); it can "
            f"be uncordoned once that drain has finished; {_follow_or_cancel(node.drain_id)}"
        )
    if not node.cordoned:
        return Change(stream=node_stream(node_id))
    return Change(stream=node_stream(node_id), events=(NodeUncordoned(node_id=node_id),))


def cordon_gpu(state: ClusterState, node_id: str, gpu_index: int, reason: str) -> Change:
    """Keep new shards off the node's GPU ``gpu_index`` (``app.domain.gpu_cordons``); a
    shard on it keeps running. Cordoned again with another reason (not an empty one), the
    new reason is recorded, as for a node; the same reason again, or none, records nothing.
    A new cordon past the ``MAX_GPU_CORDONS`` the node keeps is refused."""
    node = find_node(state, node_id)
    gpu = _listed_gpu(node, gpu_index)
    errors = reason_errors("reason", reason)
    if errors:
        raise InvalidText(f"the cordon of GPU {gpu_index} of node {node_id!r}", errors)
    held = cordon_of(node, gpu)
    if held is not None and (not reason or reason == held.reason):
        return Change(stream=node_stream(node_id))
    if held is None and len(node.gpu_cordons) >= MAX_GPU_CORDONS:
        raise _too_many_cordons(node, gpu_index)
    cordoned = GpuCordoned(node_id=node_id, gpu_index=gpu.index, gpu_uuid=gpu.uuid, reason=reason)
    return Change(stream=node_stream(node_id), events=(cordoned,))


def uncordon_gpu(state: ClusterState, node_id: str, gpu_index: int) -> Change:
    """Let placements use the node's GPU ``gpu_index`` again; one not cordoned records
    nothing. The cordon lifted is that of the GPU the node lists under ``gpu_index``, else
    one recorded under ``gpu_index`` for a GPU the node no longer lists (pulled out of the
    machine): the operator can clear it, though no GPU could be cordoned so now."""
    node = find_node(state, node_id)
    gpu: NumberedGpu | None = _gpu_at(node, gpu_index)
    if gpu is None or cordon_of(node, gpu) is None:
        unlisted = next((c for c in unlisted_cordons(node) if c.index == gpu_index), None)
        if unlisted is None and gpu is None:
            raise _no_such_gpu(node, gpu_index)
        if unlisted is None:
            return Change(stream=node_stream(node_id))
        gpu = unlisted
    uncordoned = GpuUncordoned(node_id=node_id, gpu_index=gpu.index, gpu_uuid=gpu.uuid)
    return Change(stream=node_stream(node_id), events=(uncordoned,))


def _listed_gpu(node: Node, gpu_index: int) -> GpuInfo:
    """The GPU the node lists under ``gpu_index``, or the refusal naming those it lists."""
    gpu = _gpu_at(node, gpu_index)
    if gpu is None:
        raise _no_such_gpu(node, gpu_index)
    return gpu


def _too_many_cordons(node: Node, gpu_index: int) -> InvalidOperation:
    unlisted = ", ".join(str(index) for index in sorted({c.index for c in unlisted_cordons(node)}))
    lift = (
        f"uncordon one of the GPUs it no longer lists ({unlisted}) first"
        if unlisted
        else "uncordon one of them first"
    )
    return InvalidOperation(
        f"GPU {gpu_index} of node {node.id} was not cordoned: the node has "
        f"{len(node.gpu_cordons)} GPU cordons, the most it may have ({MAX_GPU_CORDONS}); {lift}"
    )


def _gpu_at(node: Node, gpu_index: int) -> GpuInfo | None:
    return next((gpu for gpu in node.gpus if gpu.index == gpu_index), None)


def _no_such_gpu(node: Node, gpu_index: int) -> InvalidOperation:
    listed = ", ".join(str(index) for index in sorted(gpu.index for gpu in node.gpus))
    has = f"its GPUs are {listed}" if listed else "it lists no GPU"
    return InvalidOperation(f"node {node.id} has no GPU {gpu_index}: {has}")


def drain_node(
    state: ClusterState,
    node_id: str,
    drain_id: str,
    grace_s: float,
    *,
    require_room: bool = False,
    running: Mapping[str, NodeReport] = NOTHING_REPORTED,
) -> NodeDrain:
    """Move every replica off the node (the reconciler carries it out, see ``drain``), and
    say which replicas have nowhere to go now (``drain_room``, ``running`` being what each
    connected node reports running); with ``require_room``, such a replica refuses the
    drain (``NoRoomToDrain``) and nothing is recorded."""
    node = find_node(state, node_id)
    if not 0 < grace_s <= MAX_DRAIN_GRACE_S:
        reason = f"must be more than 0 and at most {MAX_DRAIN_GRACE_S} (a week)"
        raise InvalidDrain(node_id, [SpecError("grace_s", reason)])
    if node.drain_id is not None:
        raise InvalidOperation(
            f"node {node_id} is already draining (drain {node.drain_id}{_drain_since(node)}); "
            f"{_follow_or_cancel(node.drain_id)}"
        )
    requested = NodeDrainRequested(node_id=node_id, drain_id=drain_id, grace_s=grace_s)
    room = room_for_drain(state, requested, running)
    if require_room and any(not r.has_room for r in room):
        raise NoRoomToDrain(node_id, room)
    return NodeDrain(
        stream=node_stream(node_id),
        events=(requested,),
        drain_id=drain_id,
        room=room,
        drains_beside=_drains_under_way(state) if require_room else None,
    )


def room_overtaken(drain: NodeDrain, state: ClusterState) -> str | None:
    """Whether a drain that required room may still be recorded on ``state`` (the log as it
    is appended on, the drain in it): None, or the stream of another node whose drain
    began since the room was found, and whose moves may take it. Each node's drain is on
    its own stream, so two drains at once are both appended at their streams' versions;
    asked this, the second is refused as a conflict and decided again beside the first."""
    if drain.drains_beside is None:
        return None
    for node_id, drain_id in sorted(_drains_under_way_by_node(state).items()):
        if drain_id != drain.drain_id and drain_id not in drain.drains_beside:
            return node_stream(node_id)
    return None


def _drains_under_way(state: ClusterState) -> frozenset[str]:
    return frozenset(_drains_under_way_by_node(state).values())


def _drains_under_way_by_node(state: ClusterState) -> dict[str, str]:
    """Node id -> its drain's id, for every node drain under way and not called off."""
    return {
        node.id: node.drain_id
        for node in state.nodes.values()
        if node.drain_id is not None and node.drain_cancelled_by is None
    }


def _follow_or_cancel(drain_id: str) -> str:
    """What an operator refused for a draining node can do: the CLI's command, and the
    admin API's path for a client of the API."""
    return (
        f"follow it with `llmgw-cli drain-progress {drain_id}` "
        f"(GET /admin/v1/drains/{drain_id}), or call it off with "
        f"`llmgw-cli drain-cancel {drain_id}` (POST /admin/v1/drains/{drain_id}/cancel)"
    )


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


def find_node(state: ClusterState, node_id: str) -> Node:
    return find_known(state.nodes, node_id, UnknownNode)


def find_replica(state: ClusterState, replica_id: str) -> Replica:
    return find_known(state.replicas, replica_id, UnknownReplica)


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
