"""Rule 11 of ``reconcile.decide``: the commands a pass sends agents. It starts placed shards
(and shards their agents stopped on purpose) where they do not run, and stops what should
not run once it has left routing: after the quiesce time, and once gateways report nothing
in flight on it (or after the drain idle timeout)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from app.domain.commands import StartShard, StopShard, start_command, stop_command
from app.domain.decision import Draft
from app.domain.reconcile_settings import Settings
from app.domain.reports import FleetView
from app.domain.state import ACTIVE_PHASES, ClusterState, Replica, ReplicaPhase, ShardPhase

STOPPED_BY_PLAN = frozenset({ReplicaPhase.STOPPED, ReplicaPhase.FAILED, ReplicaPhase.TIMED_OUT})
"""Ended replicas whose engines are stopped as planned (a lost one's are strays)."""


def note_left_routing(left: Mapping[str, int], state: ClusterState) -> dict[str, int]:
    """The stopping replicas, each with the fold's position when first seen out of routing:
    ``left``'s for those it has, ``state``'s own for the others (its leaving is at or before
    the position of the state it is seen in); replicas no longer stopping are dropped."""
    return {
        r.id: left.get(r.id, state.position)
        for r in state.replicas.values()
        if r.phase is ReplicaPhase.STOPPING
    }


def _still_quiescing(replica: Replica, fleet: FleetView, now: datetime, s: Settings) -> bool:
    """A stopping replica keeps running for ``quiesce_s`` (unless every live gateway has
    already applied a routing table without it), then while a gateway reports a request in
    flight on it or a gateway is silent (what it has open is unknown), up to
    ``drain_idle_timeout_s``."""
    if replica.stopping_since is None:
        return False
    waited = (now - replica.stopping_since).total_seconds()
    if waited < s.quiesce_s and not _out_of_every_gateways_routing(replica, fleet):
        return True
    busy = fleet.in_flight.get(replica.id, 0) > 0 or fleet.silent_gateways > 0
    return busy and waited < s.drain_idle_timeout_s


def _out_of_every_gateways_routing(replica: Replica, fleet: FleetView) -> bool:
    """Whether every gateway said, in the report its in-flight counts come from, that it
    routed by a table from after the replica left routing: none sends it anything new. Not
    while a gateway is silent: which table it routes by is unknown."""
    left = fleet.left_routing.get(replica.id)
    return (
        left is not None
        and fleet.routing_seen is not None
        and fleet.routing_seen >= left
        and fleet.silent_gateways == 0
    )


def shard_commands(draft: Draft, fleet: FleetView, settings: Settings) -> None:
    state = draft.state
    for replica in state.replicas.values():
        model = state.models.get(replica.model)
        if replica.phase in ACTIVE_PHASES and replica.phase is not ReplicaPhase.STOPPING:
            for shard in replica.shards:
                report = fleet.reports.get(shard.node_id)
                if (
                    model is not None
                    and (shard.phase is ShardPhase.PLACED or shard.stopped_by_agent)
                    and report is not None
                    and (replica.id, shard.index) not in report.shards
                ):
                    command: StartShard | StopShard = start_command(
                        state, model.spec_of(replica.revision), replica, shard
                    )
                    draft.command(shard.node_id, command)
            continue
        if replica.phase is ReplicaPhase.STOPPING and _still_quiescing(
            replica, fleet, draft.now, settings
        ):
            continue
        if replica.phase is ReplicaPhase.STOPPING or replica.phase in STOPPED_BY_PLAN:
            grace = model.spec.stop_grace_s if model else 30.0
            for shard in replica.shards:
                report = fleet.reports.get(shard.node_id)
                running = report.shards.get((replica.id, shard.index)) if report else None
                if running is not None and running.running and running.port == shard.port:
                    draft.command(shard.node_id, stop_command(replica.id, shard.index, grace))
