"""What the fleet says right now: not in the log, observed live. Pure.

``observe(view, report, model_of)`` folds one agent report into the view, as ``evolve``
folds an event into the log's state. Per node that said hello to this control plane:

- a hello replaces the node's shards by the ones it lists, and gives the node a new
  greeting number (a command sent before it is sent again after it);
- a heartbeat updates the states of the shards it lists that the view knows (it carries no
  port, so a shard the view does not know waits for its status or the next hello);
- a shard status inserts or updates that shard; ``stopped`` and ``failed`` keep it with that
  state, which takes it out of the running set;
- a disconnect drops the node.

Gateways report how many requests each replica has in flight (``in_flight``, put in by the
reconciler), so a replica taken out of routing is stopped only once it is idle."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from app.domain.reports import (
    AgentConnected,
    AgentDisconnected,
    AgentReport,
    HeartbeatReport,
    ReportedShard,
    ShardStatusReport,
)

ShardKey = tuple[str, int]
ModelOf = Callable[[str], str | None]
"""The model of a replica the log knows; a shard status does not carry it."""


class NodeReport(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    shards: dict[ShardKey, ReportedShard] = {}
    greeting: int = 0
    """Changes with every hello of the node."""


class FleetView(msgspec.Struct, frozen=True, kw_only=True):
    reports: dict[str, NodeReport] = {}
    in_flight: dict[str, int] = {}
    """Requests open on each replica, summed over the gateways that reported recently;
    a replica no gateway reports has none."""
    hellos: int = 0
    """Hellos observed so far: the source of greeting numbers."""

    def greeting(self, node_id: str) -> int | None:
        report = self.reports.get(node_id)
        return report.greeting if report is not None else None


def observe(view: FleetView, report: AgentReport, model_of: ModelOf) -> FleetView:
    """The view after ``report``; ``view`` itself when the report changes nothing."""
    match report:
        case AgentConnected(shards=shards):
            hellos = view.hellos + 1
            node = NodeReport(
                node_id=report.node_id,
                shards={(s.replica_id, s.shard_index): s for s in shards},
                greeting=hellos,
            )
            return msgspec.structs.replace(
                view, reports={**view.reports, node.node_id: node}, hellos=hellos
            )
        case HeartbeatReport():
            return _heartbeat(view, report)
        case ShardStatusReport():
            return _shard_status(view, report, model_of)
        case AgentDisconnected(node_id=node_id):
            if node_id not in view.reports:
                return view
            reports = {n: r for n, r in view.reports.items() if n != node_id}
            return msgspec.structs.replace(view, reports=reports)
        case _:
            return view


def _heartbeat(view: FleetView, report: HeartbeatReport) -> FleetView:
    node = view.reports.get(report.node_id)
    if node is None:
        return view
    shards = dict(node.shards)
    for replica_id, shard_index, state in report.shard_states:
        known = shards.get((replica_id, shard_index))
        if known is not None and known.state != state:
            shards[(replica_id, shard_index)] = msgspec.structs.replace(known, state=state)
    if shards == node.shards:
        return view
    return _with_shards(view, node, shards)


def _shard_status(view: FleetView, report: ShardStatusReport, model_of: ModelOf) -> FleetView:
    node = view.reports.get(report.node_id) or NodeReport(node_id=report.node_id)
    phase = report.phase
    key = (phase.replica_id, phase.shard_index)
    known = node.shards.get(key)
    shard = ReportedShard(
        replica_id=phase.replica_id,
        shard_index=phase.shard_index,
        model=known.model if known else model_of(phase.replica_id) or "",
        port=report.port,
        pid=phase.pid if phase.pid is not None else (known.pid if known else None),
        state=phase.phase.value,
    )
    if known == shard:
        return view
    return _with_shards(view, node, {**node.shards, key: shard})


def _with_shards(
    view: FleetView, node: NodeReport, shards: dict[ShardKey, ReportedShard]
) -> FleetView:
    updated = msgspec.structs.replace(node, shards=shards)
    return msgspec.structs.replace(view, reports={**view.reports, node.node_id: updated})
