"""Drain as a rolling move.

Draining a node cordons it; then, for every replica on it, at most ``max_moves`` per model
at a time: the replica is marked draining (it keeps serving but no longer counts towards
its model's desired count), so the scale rule places a replacement elsewhere. Once the
replacement has served for the stability window (a replacement that flaps never ends the
move) and its nodes report it ready now, the original is taken out of routing and stopped:
a leader that takes over mid-move heard nothing of the replacement while it was away, nor
does any leader while the replacement's node is disconnected, and the log's word that it
served is no proof that it still does. A replica that was not serving yet
has nothing to protect and is stopped at once. The drain's grace bounds it all: when it runs
out, whatever is left on the node is stopped and that is recorded, so a node can always be
taken out of service. Every step carries the drain's id as correlation id.

An operator may call a node drain off (``node_drain_cancelled``): the next pass, before any
other step, calls off each of its moves under way (``replica_drain_cancelled``: the original
serves and counts again, and the scale rule then stops the replica beyond the model's
count: the newest not serving yet, else the newest serving; a replacement is newer than
its original, so that is never the original while its replacement counts) and finishes
the drain as cancelled. An original already stopping stays stopped (its replacement
serves in its place), and the node stays cordoned until the operator uncordons it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta

from app.domain.decision import Draft
from app.domain.events import (
    NodeDrainFinished,
    ReplacementServing,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaStopping,
    node_stream,
    replica_stream,
)
from app.domain.reports import NodeReport
from app.domain.state import (
    ACTIVE_PHASES,
    NOT_SERVING_YET,
    ClusterState,
    Model,
    Node,
    Replica,
    ReplicaPhase,
    is_gpu_move,
)

NODE_DRAIN_COMPLETE = "every replica moved"
"""The outcome of a node drain that moved every replica that served on the node."""
NODE_DRAIN_NOTHING_SERVED = "no replica was serving on the node"
"""The outcome of a node drain that had nothing to move: no replica served on the node when
the drain began, and none was moved off it (one that was not serving yet was stopped, not
moved). It succeeded."""
NODE_DRAIN_NOT_NEEDED = "every replica moved or was not needed"
"""How the outcome of a node drain begins when a replica on the node was stopped because its
model had its count without it, and every other one moved: the drain succeeded."""
NODE_DRAIN_GRACE_RAN_OUT = "grace ran out; what was left was stopped"
NODE_DRAIN_CANCELLED = "cancelled by"
"""How the outcome of a node drain an operator called off begins: ``cancelled by alice``."""
UNMOVED_NAMED = 5
"""The replicas a drain's outcome names that ended without a replacement; the rest are
counted."""
REASON_CHARS = 160


def drain_moves(
    draft: Draft,
    stability_window_s: float,
    replica_grace_s: float,
    *,
    reports: Mapping[str, NodeReport],
) -> None:
    """``reports``: what each node that said hello to this leader reports running."""
    # A pass sorts only the drains called off, seldom any, not every node a second time.
    called_off = [
        (node.id, node.drain_id, node.drain_cancelled_by)
        for node in draft.state.nodes.values()
        if node.drain_id is not None and node.drain_cancelled_by is not None
    ]
    for node_id, drain_id, cancelled_by in sorted(called_off):
        _cancel_node_drain(draft, node_id, drain_id, cancelled_by)
    _finish_moves(draft, stability_window_s, replica_grace_s, reports)
    for node in sorted(draft.state.nodes.values(), key=lambda n: n.id):
        if node.drain_id is not None:
            _drain_node(draft, node)


def _cancel_node_drain(draft: Draft, node_id: str, drain_id: str, cancelled_by: str) -> None:
    """Call off each move of the node's drain still under way, then finish the drain."""
    moving = [
        r
        for r in draft.state.replicas.values()
        if r.phase is ReplicaPhase.DRAINING and r.drain_id == drain_id
    ]
    for replica in sorted(moving, key=lambda r: r.id):
        draft.emit(
            replica_stream(replica.id),
            ReplicaDrainCancelled(
                replica_id=replica.id,
                drain_id=drain_id,
                reason=f"drain {drain_id} was cancelled by {cancelled_by}: it serves on",
            ),
            correlation_id=drain_id,
        )
    finished = NodeDrainFinished(
        node_id=node_id,
        drain_id=drain_id,
        outcome=f"{NODE_DRAIN_CANCELLED} {cancelled_by}",
        succeeded=False,
    )
    draft.emit(node_stream(node_id), finished, correlation_id=drain_id)


def _finish_moves(
    draft: Draft,
    stability_window_s: float,
    replica_grace_s: float,
    reports: Mapping[str, NodeReport],
) -> None:
    """Each move under way (``Model.moves``, a lookup: no scan of the replicas) ends once
    its replacement has served for the stability window and its nodes report it ready, or
    when its grace runs out."""
    state, now = draft.state, draft.now
    moves = [move for model in state.models.values() for move in model.moves.values()]
    for move in moves:
        original = state.replicas.get(move.replica_id)
        if original is None or original.phase is not ReplicaPhase.DRAINING:
            continue
        window_s = _stability_window_s(draft, original, stability_window_s)
        replacement = (
            state.replicas.get(move.replacement_id) if move.replacement_id is not None else None
        )
        if (
            replacement is not None
            and replacement.phase is ReplicaPhase.SERVING
            and replacement.serving_since is not None
            and now - replacement.serving_since >= timedelta(seconds=window_s)
            and _reported_ready(replacement, reports)
        ):
            draft.emit(
                replica_stream(original.id),
                ReplacementServing(replica_id=original.id, replacement_id=replacement.id),
                correlation_id=original.drain_id,
            )
            draft.emit(
                replica_stream(original.id),
                ReplicaStopping(
                    replica_id=original.id,
                    reason=(
                        f"drain {original.drain_id}: replacement {replacement.id} has served "
                        f"for {window_s:g}s"
                    ),
                ),
                correlation_id=original.drain_id,
            )
        elif _replica_grace_over(draft, original, replica_grace_s):
            draft.emit(
                replica_stream(original.id),
                ReplicaStopping(
                    replica_id=original.id,
                    reason=f"drain {original.drain_id}: grace ran out before a replacement served",
                ),
                correlation_id=original.drain_id,
            )


def _reported_ready(replica: Replica, reports: Mapping[str, NodeReport]) -> bool:
    """Whether the node of every shard of ``replica`` reports it ready to this leader."""
    for shard in replica.shards:
        report = reports.get(shard.node_id)
        reported = report.shards.get((replica.id, shard.index)) if report is not None else None
        if reported is None or not reported.ready or reported.port != shard.port:
            return False
    return True


def _stability_window_s(draft: Draft, original: Replica, default_s: float) -> float:
    """A rollout's move waits its policy's stability window when the policy sets one."""
    model = draft.state.models.get(original.model)
    if model is None or not _moved_by_rollout(model, original):
        return default_s
    window_s = model.spec.rollout.stability_window_s
    return default_s if window_s is None else window_s


def _moved_by_rollout(model: Model, original: Replica) -> bool:
    return model.rollout is not None and model.rollout.id == original.drain_id


def _replica_grace_over(draft: Draft, replica: Replica, replica_grace_s: float) -> bool:
    """A replica drained on its own has its own grace; one drained with its node, the node's.

    A rollout's move has no grace: it waits for its replacement however long that takes to
    start (the replacement's startup timeout and the rollout's ``max_failures`` bound it),
    since whether an original may stop first is ``max_unavailable``'s to say. Nor has a move
    off an unhealthy GPU (``gpu_moves``): its original serves until its replacement does.
    (A node drain whose grace runs out stops it with the rest of the node.)"""
    for node_id in replica.node_ids:
        node = draft.state.nodes.get(node_id)
        if node is not None and node.drain_id == replica.drain_id:
            return _node_grace_over(draft, node)
    model = draft.state.models.get(replica.model)
    if model is not None and _moved_by_rollout(model, replica):
        return False
    if is_gpu_move(replica.drain_id):
        return False
    started = replica.drain_started_at
    return started is not None and draft.now - started > timedelta(seconds=replica_grace_s)


def _node_grace_over(draft: Draft, node: Node) -> bool:
    if node.drain_requested_at is None or node.drain_grace_s is None:
        return False
    return draft.now - node.drain_requested_at > timedelta(seconds=node.drain_grace_s)


def _drain_node(draft: Draft, node: Node) -> None:
    state = draft.state
    drain_id = node.drain_id
    grace_over = _node_grace_over(draft, node)
    for replica_id, step in node_drain_steps(state, node, grace_over=grace_over):
        draft.emit(replica_stream(replica_id), step, correlation_id=drain_id)
    still_there = any(
        r.phase in ACTIVE_PHASES and node.id in r.node_ids for r in state.replicas.values()
    )
    if not still_there:
        outcome, succeeded = (
            (NODE_DRAIN_GRACE_RAN_OUT, False) if grace_over else _moved_outcome(state, node)
        )
        finished = NodeDrainFinished(
            node_id=node.id, drain_id=drain_id or "", outcome=outcome, succeeded=succeeded
        )
        draft.emit(node_stream(node.id), finished, correlation_id=drain_id)


DrainStep = ReplicaDrainStarted | ReplicaStopping


def node_drain_steps(
    state: ClusterState, node: Node, *, grace_over: bool = False, paced: bool = True
) -> list[tuple[str, DrainStep]]:
    """What a pass of the node's drain (``node.drain_id``) does to each replica on it, by
    replica id: one not serving yet stops (nothing to move); once the grace is over, one
    serving or draining stops too; otherwise a serving one starts to move, at most its
    model's ``max_moves`` moves under way at once, or every one when not ``paced``
    (``drain_room`` asks where each would go)."""
    drain_id = node.drain_id
    on_node = [
        r for r in state.replicas.values() if r.phase in ACTIVE_PHASES and node.id in r.node_ids
    ]
    moving = Counter({name: moves_under_way(state, name) for name in state.models})
    steps: list[tuple[str, DrainStep]] = []
    for replica in sorted(on_node, key=lambda r: r.id):
        if replica.phase in NOT_SERVING_YET:
            reason = f"drain {drain_id}: not serving yet, nothing to move"
            steps.append((replica.id, ReplicaStopping(replica_id=replica.id, reason=reason)))
        elif grace_over and replica.phase in (ReplicaPhase.SERVING, ReplicaPhase.DRAINING):
            # A draining one here is another drain's or a rollout's move: the node's grace
            # bounds it all the same.
            reason = f"drain {drain_id}: grace ran out before it could move"
            steps.append((replica.id, ReplicaStopping(replica_id=replica.id, reason=reason)))
        elif replica.phase is ReplicaPhase.SERVING and (
            not paced or moving[replica.model] < max_moves(state, replica.model)
        ):
            started = ReplicaDrainStarted(
                replica_id=replica.id, drain_id=drain_id or "", reason=f"node {node.id} drains"
            )
            steps.append((replica.id, started))
            moving[replica.model] += 1
    return steps


def moves_under_way(state: ClusterState, model: str) -> int:
    """The model's moves under way, of every kind: node and replica drains, rollouts, moves
    off unhealthy GPUs (``Model.moves``)."""
    known = state.models.get(model)
    return len(known.moves) if known is not None else 0


def max_moves(state: ClusterState, model: str) -> int:
    """How many moves of the model may be under way at once (its spec's ``max_moves``)."""
    known = state.models.get(model)
    return known.spec.max_moves if known is not None else 1


def _moved_outcome(state: ClusterState, node: Node) -> tuple[str, bool]:
    """The outcome and whether the drain succeeded: ``every replica moved`` (``no replica
    was serving on the node`` when there was nothing to move), unless a replica that
    served on the node when its drain began (``Node.drain_began_with``), or one the drain
    moved, ended before a replacement served. One the scale rule stopped
    because its model had its count without it (a scale-down, a move an undo called off)
    was not needed: the node was emptied and the model kept its count, and the drain
    succeeded, saying so. One that anything else ended (the drain: its agent shut down, its
    engine failed; a rollout: ``max_unavailable``, a superseded move) was not moved, and
    the drain failed. Either way, how many moved and which did not, with why they ended."""
    drain_id = node.drain_id
    ids = {
        *node.drain_began_with,
        *(r.id for r in state.replicas.values() if r.drain_id == drain_id),
    }
    if not ids:
        return NODE_DRAIN_NOTHING_SERVED, True
    ended = [
        (replica_id, replica)
        for replica_id in sorted(ids)
        if (replica := state.replicas.get(replica_id)) is None or replica.replacement_id is None
    ]
    if not ended:
        return NODE_DRAIN_COMPLETE, True
    surplus = [(i, r) for i, r in ended if r is not None and r.surplus]
    unmoved = [(i, r) for i, r in ended if r is None or not r.surplus]
    told = [f"{len(ids) - len(ended)} moved"]
    if surplus:
        told.append(
            f"{len(surplus)} stopped with its model at its count without it: {_named(surplus)}"
        )
    if unmoved:
        told.append(f"{len(unmoved)} ended without a replacement: {_named(unmoved)}")
        return "; ".join(told), False
    return f"{NODE_DRAIN_NOT_NEEDED}: {'; '.join(told)}", True


def _named(ended: Sequence[tuple[str, Replica | None]]) -> str:
    named = ", ".join(
        f"{i} ({_unmoved_reason(r)[:REASON_CHARS]})" for i, r in ended[:UNMOVED_NAMED]
    )
    more = len(ended) - UNMOVED_NAMED
    return f"{named}{f' and {more} more' if more > 0 else ''}"


def _unmoved_reason(replica: Replica | None) -> str:
    if replica is None:  # ended long ago: the fold forgot it (``ENDED_KEPT_PER_MODEL``)
        return "ended; how is in the log (llmgw-cli history)"
    return replica.end_reason or replica.phase.value
