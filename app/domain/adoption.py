"""Adoption: the fleet is authoritative about what runs; the log about what was asked.

A node speaks only for itself: a report can adopt only a shard that the log placed on the
reporting node, at a port inside that node's declared range. For every shard a connected
agent reports running:

- the shard was placed on another node: a stray on the reporting node, whatever the state
  of the log's copy (a node with a valid certificate must not be able to take over another
  node's replica by naming it);
- it is the log's copy (same replica, shard, node and port) at a port outside the node's
  declared range (its agent came back with another one): neither adopted nor a stray, its
  replica is stopped by plan, not failed, by rule 5 (``ports_out_of_range``);
- another port than the log's, outside the reporting node's declared range: a stray;
- it matches the log (same replica, shard, node and port): adopted, once per leader epoch
  (a shard placed by this leader needs no adoption); reported ready when the log has it
  starting, by a shard this leader placed or adopted already, it is recorded ready
  (``shard_ready``: a status the log missed), not adopted a second time;
- the log's copy on this node never came up and the engine answers on another port of
  this node: the running engine wins and is adopted in its place, port and all (an
  earlier leader started it there and the log lost or never recorded that start);
- the log's copy came up on another port: two engines really run; the reported one, which
  nobody asked for, is stopped as a stray (its end, at its port and with its pid, is not
  recorded against the log's copy: ``agent_reports.shard_reported``);
- the replica is unknown to the log, or was lost (its node came back after it was
  replaced): a stray. The engine of a replica that ended otherwise (stopped, failed, timed
  out) is simply stopped: that is the plan, not a surprise.

Each case is an event naming the rule that applied. A node has at most
``STRAYS_REMEMBERED`` stray stops under way (``_stray``), so one that stops none of its
strays cannot have them recorded again at every pass.
"""

from __future__ import annotations

from app.domain.commands import stray_stop_command
from app.domain.decision import Draft
from app.domain.events import (
    ReplicaAdopted,
    ShardReady,
    StrayStopped,
    node_stream,
    replica_stream,
)
from app.domain.ports_out_of_range import in_port_range
from app.domain.reports import FleetView, ReportedShard
from app.domain.state import (
    ACTIVE_PHASES,
    STRAYS_REMEMBERED,
    Replica,
    ReplicaPhase,
    ShardPhase,
    stray_key,
)

MATCHES = "matches the log"
NEVER_CAME_UP = "the log's copy never came up; the running engine takes its place"


def adopt_reported(draft: Draft, fleet: FleetView, stray_grace_s: float) -> None:
    for node_id in sorted(fleet.reports):
        running = [s for s in fleet.reports[node_id].shards.values() if s.running]
        running_keys = {_stray_key(s) for s in running}
        for reported in running:
            rule = _adopt_one(draft, node_id, reported)
            if rule is not None:
                _stray(draft, node_id, reported, rule, stray_grace_s, running_keys)


def _adopt_one(draft: Draft, node_id: str, reported: ReportedShard) -> str | None:
    """Adopt ``reported`` if it is the log's; the rule that makes it a stray otherwise, or
    None when it needs nothing."""
    state = draft.state
    replica = state.replicas.get(reported.replica_id)
    if replica is None:
        return "the log knows no such replica"
    if replica.phase not in ACTIVE_PHASES:
        if replica.phase is not ReplicaPhase.LOST and _is_logged_copy(replica, node_id, reported):
            return None  # our own engine of a replica that ended: its stop command is on the way
        return f"replica {replica.id} is {replica.phase.value}"
    if reported.shard_index >= len(replica.shards):
        return f"replica {replica.id} has no shard {reported.shard_index}"
    shard = replica.shards[reported.shard_index]
    node = state.nodes.get(node_id)
    if node is None:
        return "the reporting node is unknown to the log"
    if shard.node_id != node.id:
        return f"placed on {shard.node_id}, reported by {node.id}"
    in_range = in_port_range(node, reported.port)
    if shard.port == reported.port:
        if not in_range:
            return None  # the log's copy, at a port its node no longer accepts: rule 5's
        if shard.epoch != draft.epoch:
            _adopt(draft, node_id, reported, MATCHES)
        elif reported.ready and shard.phase in (ShardPhase.PLACED, ShardPhase.STARTING):
            shard_ready = ShardReady(
                replica_id=reported.replica_id, shard_index=reported.shard_index, node_id=node_id
            )
            draft.emit(replica_stream(reported.replica_id), shard_ready)
        return None
    if not in_range:
        low, high = node.port_range
        return f"port {reported.port} is outside {node.id}'s declared port range {low}-{high}"
    if not shard.came_up:
        _adopt(draft, node_id, reported, NEVER_CAME_UP)
        return None
    return (
        f"the log's copy came up on {shard.node_id} port {shard.port}; "
        "two engines run and this one was not asked for"
    )


def _is_logged_copy(replica: Replica, node_id: str, reported: ReportedShard) -> bool:
    if reported.shard_index >= len(replica.shards):
        return False
    shard = replica.shards[reported.shard_index]
    return shard.node_id == node_id and shard.port == reported.port


def _adopt(draft: Draft, node_id: str, reported: ReportedShard, rule: str) -> None:
    draft.emit(
        replica_stream(reported.replica_id),
        ReplicaAdopted(
            replica_id=reported.replica_id,
            shard_index=reported.shard_index,
            node_id=node_id,
            port=reported.port,
            pid=reported.pid,
            ready=reported.ready,
            rule=rule,
        ),
    )


def _stray(
    draft: Draft,
    node_id: str,
    reported: ReportedShard,
    rule: str,
    grace_s: float,
    running_keys: set[str],
) -> None:
    """Record the stray once and send its stop. The node remembers the last
    ``STRAYS_REMEMBERED`` strays recorded on it; while that many of them still run (their
    stops on their way, or never obeyed), a new one waits, unrecorded and not yet stopped:
    recording it would forget one that runs, recorded anew at the next pass, and so on, at
    every pass, for as long as the node reports them."""
    node = draft.state.nodes.get(node_id)
    key = _stray_key(reported)
    if node is not None and key not in node.stray_stops:
        if sum(k in running_keys for k in node.stray_stops) >= STRAYS_REMEMBERED:
            return
        draft.emit(
            node_stream(node_id),
            StrayStopped(
                node_id=node_id,
                replica_id=reported.replica_id,
                shard_index=reported.shard_index,
                model=reported.model,
                port=reported.port,
                pid=reported.pid,
                rule=rule,
            ),
        )
    draft.command(
        node_id,
        stray_stop_command(reported.replica_id, reported.shard_index, reported.pid, grace_s),
    )


def _stray_key(reported: ReportedShard) -> str:
    return stray_key(reported.replica_id, reported.shard_index, reported.pid)
