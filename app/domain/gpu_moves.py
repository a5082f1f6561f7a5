"""Part of rule 9 of ``reconcile.decide``: moving replicas off unhealthy GPUs.

A replica serving (or starting) with a shard on a GPU its node reports unhealthy (a GPU
held unhealthy as flapping included) is moved as an operator's replica drain moves it:
the reconciler records ``replica_drain_started`` for it, so it no longer counts towards
its model's count, the scale rule places a replacement on a healthy GPU, and the original
stops once the replacement has served for the stability window (``drain``). Unlike an
operator's replica drain the move has no grace: the original is never stopped before its
replacement serves; without room the move waits, and the placement's reason says why.

The moves are paced as a node drain's are (``drain.node_drain_steps``): at most the
model's ``max_moves`` moves under way at once, counting every move of the model (a node
drain's, a replica drain's, a rollout's, another GPU move). A node whose every GPU fails
at once would otherwise put each of a model's replicas there into a move in one pass, and
the model's whole capacity on that node into starting replacements. The others wait their
turn, serving where they are, and ``waiting_gpu_moves`` says why (``llmgw-cli model``).

One move per replica: a replica already being moved (its own drain, its node's drain, a
rollout's move) is left to that move, and one marked draining is not asked again. A GPU
that recovers does not call the move off: a GPU that failed once is suspect, and the
original serves until its replacement does. An operator may call the move off
(``llmgw-cli drain-cancel``): the replica then stays where it is, and the reconciler does
not move it off an unhealthy GPU again (``Replica.gpu_move_called_off``); an operator's
drain still moves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from app.domain.decision import Draft
from app.domain.drain import max_moves, moves_under_way
from app.domain.events import ReplicaDrainStarted, replica_stream
from app.domain.state import GPU_MOVE_PREFIX, ClusterState, Replica, ReplicaPhase

MOVED_PHASES = frozenset({ReplicaPhase.SERVING, ReplicaPhase.STARTING})


def move_off_unhealthy_gpus(draft: Draft) -> None:
    """Start a move for each replica with a shard on an unhealthy GPU, not moved yet, while
    its model has fewer than ``max_moves`` moves under way."""
    state = draft.state
    for replica, fault in _on_unhealthy_gpus(state, state.replicas.values()):
        if moves_under_way(state, replica.model) >= max_moves(state, replica.model):
            continue  # waits its turn (``waiting_gpu_moves``)
        drain_id = f"{GPU_MOVE_PREFIX}{replica.id}-{draft.now:%Y%m%dT%H%M%S}"
        # Folded into ``state`` at once: the next replica's turn counts this move.
        draft.emit(
            replica_stream(replica.id),
            ReplicaDrainStarted(replica_id=replica.id, drain_id=drain_id, reason=fault),
            correlation_id=drain_id,
        )


def waiting_gpu_moves(state: ClusterState, model: str) -> tuple[str, ...]:
    """Why each of the model's replicas on an unhealthy GPU, not moved yet, waits: its model
    has ``max_moves`` moves under way. By replica id, as the moves start."""
    under_way, limit = moves_under_way(state, model), max_moves(state, model)
    if under_way < limit:
        return ()
    replicas = [r for r in state.replicas.values() if r.model == model]
    return tuple(
        f"{replica.id} waits to move off an unhealthy GPU ({fault}): {under_way} move(s) of "
        f"{model} under way, at most {limit} (max_moves) at a time"
        for replica, fault in _on_unhealthy_gpus(state, replicas)
    )


def _on_unhealthy_gpus(
    state: ClusterState, replicas: Iterable[Replica]
) -> Iterator[tuple[Replica, str]]:
    """Each of ``replicas`` the rule moves, by id, with why: serving or starting on an
    unhealthy GPU, its move not called off, and no drain of its node to move it."""
    for replica in sorted(replicas, key=lambda r: r.id):
        if (
            replica.phase not in MOVED_PHASES
            or replica.gpu_move_called_off
            or _node_draining(state, replica)
        ):
            continue
        fault = unhealthy_gpu_of(state, replica)
        if fault is not None:
            yield replica, fault


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
