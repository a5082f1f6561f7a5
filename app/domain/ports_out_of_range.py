"""Part of rule 5 of ``reconcile.decide``: a replica with a shard at a port its node no longer
accepts is stopped, so that one within the node's range is placed instead.

An agent comes back with another ``--port-range`` and the log's shards on it may sit
outside it, two ways:

- still to start there (placed, or stopped by its agent): the agent refuses the start, and
  answers the same start again with the refusal it remembers, so it can never start;
- running there (the engine outlived its agent, which lists it in its hello): the log's
  own copy, at the port the log placed it, on the node it was placed on. Adoption leaves
  it to this rule rather than stopping it as a stray (``adoption``), so that the replica
  ends once, by plan, with the reason, instead of failing when its engine stops "without
  being asked to". An engine outside the range at another port than the log's is not the
  log's copy, and stays adoption's to stop as a stray.

Only on a node that said hello to this control plane, whose range is then the one it runs
with, and only by that node's own report: a node names its own range, never another
node's, so no report can get a replica on another node stopped this way.

Stopped rather than failed or lost: nothing failed (a failure would count against the
model's backoff and delay the replacement), and nothing runs that nobody vouches for. A
running engine leaves routing and is stopped as any stopping replica's is
(``shard_commands``). The stop may come during the adoption grace (it rests on the node's
own hello); the placement of the replacement waits for the grace's end, as every
placement does."""

from __future__ import annotations

from app.domain.decision import Draft
from app.domain.desired_count import stop_replica
from app.domain.reports import FleetView, NodeReport
from app.domain.state import COUNTING_PHASES, Node, Replica, ReplicaPhase, Shard, ShardPhase

JUDGED_PHASES = COUNTING_PHASES | {ReplicaPhase.DRAINING}
"""A draining replica is judged too: its replacement is on its way already."""


def stop_ports_out_of_range(draft: Draft, fleet: FleetView) -> None:
    state = draft.state
    for replica in list(state.replicas.values()):
        if replica.phase not in JUDGED_PHASES:
            continue
        reason = _out_of_range(replica, state.nodes, fleet)
        if reason is not None:
            stop_replica(draft, replica, reason)


def in_port_range(node: Node, port: int) -> bool:
    """Whether ``node`` accepts ``port``, as the log knows its range."""
    low, high = node.port_range
    return low <= port <= high


def _out_of_range(replica: Replica, nodes: dict[str, Node], fleet: FleetView) -> str | None:
    """Why ``replica`` cannot start or keep running where it was placed, or None while it
    still may."""
    for shard in replica.shards:
        node = nodes.get(shard.node_id)
        report = fleet.reports.get(shard.node_id)
        if node is None or not node.connected or report is None:
            continue
        if not _judged(replica.id, shard, report):
            continue
        if not in_port_range(node, shard.port):
            low, high = node.port_range
            return f"port {shard.port} is outside {node.id}'s port range {low}-{high}"
    return None


def _judged(replica_id: str, shard: Shard, report: NodeReport) -> bool:
    """Whether the node's report makes ``shard`` this rule's: not reported and still to
    start, or reported running at the log's port."""
    reported = report.shards.get((replica_id, shard.index))
    if reported is None:
        return shard.phase is ShardPhase.PLACED or shard.stopped_by_agent
    return reported.running and reported.port == shard.port
