"""Part of rule 9 of ``reconcile.decide``: moving replicas off unhealthy GPUs.

A replica serving (or starting) with a shard on a GPU its node reports unhealthy (a GPU
held unhealthy as flapping included) is moved as an operator's replica drain moves it:
the reconciler records ``replica_drain_started`` for it, so it no longer counts towards
its model's count, the scale rule places a replacement on a healthy GPU, and the original
stops once the replacement has served for the stability window (``drain``). Unlike an
operator's replica drain the move has no grace: the original is never stopped before its
replacement serves; without room the move waits, and the placement's reason says why.

One move per replica: a replica already being moved (its own drain, its node's drain, a
rollout's move) is left to that move, and one marked draining is not asked again. A GPU
that recovers does not call the move off: a GPU that failed once is suspect, and the
original serves until its replacement does. An operator may call the move off
(``llmgw-cli drain-cancel``): the replica then stays where it is, and the reconciler does
not move it off an unhealthy GPU again (``Replica.gpu_move_called_off``); an operator's
drain still moves it.
"""

from __future__ import annotations

from app.domain.decision import Draft
from app.domain.events import ReplicaDrainStarted, replica_stream
from app.domain.state import GPU_MOVE_PREFIX, ClusterState, Replica, ReplicaPhase

MOVED_PHASES = frozenset({ReplicaPhase.SERVING, ReplicaPhase.STARTING})


def move_off_unhealthy_gpus(draft: Draft) -> None:
    """Start a move for each replica with a shard on an unhealthy GPU, not moved yet."""
    state = draft.state
    for replica in sorted(state.replicas.values(), key=lambda r: r.id):
        if (
            replica.phase not in MOVED_PHASES
            or replica.gpu_move_called_off
            or _node_draining(state, replica)
        ):
            continue
        fault = unhealthy_gpu_of(state, replica)
        if fault is None:
            continue
        drain_id = f"{GPU_MOVE_PREFIX}{replica.id}-{draft.now:%Y%m%dT%H%M%S}"
        draft.emit(
            replica_stream(replica.id),
            ReplicaDrainStarted(replica_id=replica.id, drain_id=drain_id, reason=fault),
            correlation_id=drain_id,
        )


def unhealthy_gpu_of(state: ClusterState, replica: Replica) -> str | None:
    """Why the first unhealthy GPU among the replica's shards' is (node, index, reason);
    None when all are healthy."""
    for shard in replica.shards:
        node = state.nodes.get(shard.node_id)
        if node is None:
            continue
        for gpu in node.gpus:
            if gpu.index in shard.gpus and not gpu.healthy:
                why = gpu.unhealthy_reason or "no reason given"
                return f"GPU {gpu.index} of node {node.id} is unhealthy ({why})"
    return None


def _node_draining(state: ClusterState, replica: Replica) -> bool:
    """Whether a node the replica runs on is being drained: its drain moves the replica."""
    for node_id in replica.node_ids:
        node = state.nodes.get(node_id)
        if node is not None and node.drain_id is not None:
            return True
    return False
