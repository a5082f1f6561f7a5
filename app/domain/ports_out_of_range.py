"""Part of rule 5 of ``reconcile.decide``: a replica with a shard to start at a port its
node no longer accepts is stopped, so that one within the node's range is placed instead.

An agent refuses to start an engine outside its ``--port-range``, and answers the same start
again with the refusal it remembers: a shard placed at a port the node's range no longer
holds (its agent came back with another range) can never start there. Only shards that do
not run are judged (placed, or stopped by their agent): a running engine outside the range
is its agent's to report, and adoption's to judge (a stray). Only on a node that said hello
to this control plane, whose range is then the one it runs with.

Stopped rather than failed or lost: nothing failed (a failure would count against the
model's backoff and delay the replacement), and nothing runs that nobody vouches for. The
stop may come during the adoption grace (it rests on the node's own hello); the placement
of the replacement waits for the grace's end, as every placement does."""

from __future__ import annotations

from app.domain.decision import Draft
from app.domain.desired_count import COUNTING_PHASES, stop_replica
from app.domain.reports import FleetView
from app.domain.state import Node, Replica, Shard, ShardPhase


def stop_ports_out_of_range(draft: Draft, fleet: FleetView) -> None:
    state = draft.state
    for replica in list(state.replicas.values()):
        if replica.phase not in COUNTING_PHASES:
            continue
        reason = _out_of_range(replica, state.nodes, fleet)
        if reason is not None:
            stop_replica(draft, replica, reason)


def _out_of_range(replica: Replica, nodes: dict[str, Node], fleet: FleetView) -> str | None:
    """Why ``replica`` cannot start where it was placed, or None while it still may."""
    for shard in replica.shards:
        node = nodes.get(shard.node_id)
        report = fleet.reports.get(shard.node_id)
        if node is None or not node.connected or report is None:
            continue
        if not _waits_to_start(shard) or (replica.id, shard.index) in report.shards:
            continue
        low, high = node.port_range
        if not low <= shard.port <= high:
            return f"port {shard.port} is outside {node.id}'s port range {low}-{high}"
    return None


def _waits_to_start(shard: Shard) -> bool:
    return shard.phase is ShardPhase.PLACED or shard.stopped_by_agent
