"""What agents report, in domain terms, and the live fleet view those reports fold into.

The agent hub converts each wire message to one of these reports at its edge
(``app.hub.edge``), and nothing past it sees the wire. Two pure folds take them in: the
log's decisions (``app.domain.agent_reports``) and the live view here.

The live view is what the fleet says right now: not in the log, observed live.
``observe(view, report, model_of)`` folds one agent report into the view, as ``evolve``
folds an event into the log's state. Per node that said hello to this control plane:

- a hello replaces the node's shards by the ones it lists, and gives the node a new
  greeting number (a command sent before it is sent again after it);
- a heartbeat takes in the GPU memory readings it carries (``gpu_memory_used_mib``: what
  each GPU the hello listed has in use now, by every process, ours or not), and updates
  the states of the shards it lists that the view knows (it carries no
  port, so a shard the view does not know waits for its status or the next hello), and
  drops the ended ones (``stopped``, ``failed``) it no longer lists: a heartbeat lists
  every shard the agent knows, so those are gone from the node, and the view of a node
  holds what its agent does (its running shards and its last failures), not every shard
  ever started on the connection. A shard its agent stopped of its own accord
  (``ReportedShard.stopped_by_agent``) stays until the node's next hello or its
  disconnect: the log starts it again only once the node is back, and a start sent while
  the view says nothing of it would reach an agent on its way out;
- a shard status inserts or updates that shard; ``stopped`` and ``failed`` keep it with that
  state, which takes it out of the running set, until a heartbeat no longer lists it;
- a disconnect drops the node, and keeps why in ``disconnected`` until its next hello: the
  log has the node connected until the disconnect is recorded, and one that could not be
  (the database away) is recorded by the reconciler later, which tells it from a
  connection of a control plane before this one by that;
- a command this control plane sent the node (``command_sent``, with when: the
  reconciler's clock) is awaited until the agent answers it (``CommandAnswered``), its
  next hello, or its disconnect. An agent reports what a start did before it answers the
  start, so while a start is awaited its engine may be coming up unreported (for as long
  as the reconciler lets an unanswered start count: ``replica_outcomes._shard_gone``).

Gateways report how many requests each replica has in flight (``in_flight``, put in by the
reconciler), so a replica taken out of routing is stopped only once it is idle.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

import msgspec

from app.domain.adoption_grace import Arrivals
from app.domain.autoscale import DemandSample
from app.domain.events import GpuInfo
from app.domain.state import ShardPhase
from app.domain.traffic import TrafficFigures

RUNNING_STATES = frozenset({"starting", "ready"})


class ReportedShard(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    shard_index: int
    model: str
    port: int
    pid: int | None
    state: str
    stopped_by_agent: bool = False
    """``stopped`` of the agent's own accord (with a reason, as an agent shutting down
    stops its engines), not for a stop the control plane asked for."""
    failure: str | None = None
    """Why the shard failed, as the hello that listed it ``failed`` says: the node's claim,
    only ever shown (in ``replica_lost``), never decided on. Kept while heartbeats list the
    shard ``failed``."""

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def ready(self) -> bool:
        return self.state == "ready"


ReportedPhase = Literal[
    ShardPhase.STARTING, ShardPhase.READY, ShardPhase.FAILED, ShardPhase.STOPPED
]
"""The phases an agent reports; only the control plane places shards."""


class AgentInventory(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent said about its node when it connected."""

    node_id: str
    address: str
    remote_address: str
    labels: dict[str, str]
    gpus: tuple[GpuInfo, ...]
    port_range: tuple[int, int]
    agent_version: str
    certificate_serial: str = ""


class GpuHealth(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU's health as an agent last reported it."""

    index: int
    uuid: str
    healthy: bool
    reason: str | None = None
    xid: int | None = None


class ShardPhaseReport(msgspec.Struct, frozen=True, kw_only=True):
    """An agent says one of its shards is now in ``phase``."""

    replica_id: str
    shard_index: int
    phase: ReportedPhase
    pid: int | None = None
    error: str | None = None
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    reason: str | None = None
    """Why the agent stopped the shard of its own accord (``agent shutting down``); only on
    ``stopped``, never on a stop the control plane asked for."""
    port_held_elsewhere: bool = False
    """On ``failed``: a process that is not the engine listens on the shard's port."""


class IdentityClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A connection claimed a node its certificate does not prove (or a revoked one)."""

    claimed_node_id: str
    certificate_subject: str
    remote_address: str
    reason: str
    suppressed: int = 0


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A connection that proved its node was refused or cut off for what it said or did."""

    node_id: str
    remote_address: str
    certificate_serial: str
    reason: str
    suppressed: int = 0


class AgentConnected(msgspec.Struct, frozen=True, kw_only=True):
    """A hello: the node, and every shard its agent runs. ``replaced_previous``: it came on a
    connection that took over from an older one of the same node."""

    inventory: AgentInventory
    shards: tuple[ReportedShard, ...] = ()
    replaced_previous: bool = False

    @property
    def node_id(self) -> str:
        return self.inventory.node_id


class HeartbeatReport(msgspec.Struct, frozen=True, kw_only=True):
    """GPU health changes since the last heartbeat, GPU memory readings that changed, and
    the state of every shard."""

    node_id: str
    gpu_changes: tuple[GpuHealth, ...] = ()
    shard_states: tuple[tuple[str, int, str], ...] = ()
    """``(replica_id, shard_index, state)`` of every shard the agent runs."""
    gpu_memory: tuple[tuple[int, int], ...] = ()
    """``(gpu index, MiB used)`` of each GPU the hello listed whose used memory changed
    notably since its agent last said it: live state, never recorded in the log."""


class ShardStatusReport(msgspec.Struct, frozen=True, kw_only=True):
    """One shard changed state, at ``port``; ``command_id``: the command that caused it."""

    node_id: str
    phase: ShardPhaseReport
    port: int
    command_id: str | None = None


class AgentDisconnected(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str


class CommandAnswered(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's result for one command: logged, and recorded only as a start its node
    refused (``app.domain.start_refusals``); a start's or a stop's effect comes as a
    status."""

    node_id: str
    command_id: str
    ok: bool
    error: str | None = None
    sent: bool = False
    """Whether this control plane sent the node a command with this id (on any of its
    connections): only then does the answer say anything about what it acts on."""


AgentReport = (
    AgentConnected
    | HeartbeatReport
    | ShardStatusReport
    | AgentDisconnected
    | CommandAnswered
    | IdentityClaim
    | Refusal
)


def reporting_node(report: AgentReport) -> str:
    """The node a report is about: the one an agent proved, or, for an identity claim, the
    one a connection claimed to be."""
    return report.claimed_node_id if isinstance(report, IdentityClaim) else report.node_id


# The live fleet view.

ShardKey = tuple[str, int]
ModelOf = Callable[[str], str | None]
"""The model of a replica the log knows; a shard status does not carry it."""


class NodeReport(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    shards: dict[ShardKey, ReportedShard] = {}
    greeting: int = 0
    """Changes with every hello of the node."""
    awaited: dict[str, datetime] = {}
    """The commands sent to the node since its hello that it has not answered yet: each id
    with when it was sent (the reconciler's clock)."""
    gpu_memory_used_mib: dict[int, int] = {}
    """MiB in use on each GPU, by GPU index, as the node's heartbeats said it since its
    hello: placement reads it in place of the hello's (``Node.gpus``), which goes stale as
    engines stop and other processes come and go. Empty until a heartbeat says one."""


class GatewaysInFlight(msgspec.Struct, frozen=True, kw_only=True):
    """What the live gateways say of their requests in flight, read at one instant."""

    in_flight: dict[str, int]
    """Requests open per replica, summed; only replicas with some."""
    routing_seen: int | None
    """The lowest log position of the routing tables they had applied when they counted:
    a change at or before it is in every live gateway's routing. None when no gateway is
    live or one does not say (a gateway older than the column)."""
    live: int = 0
    """How many gateways reported recently. With none, no count is known: an empty
    ``in_flight`` then says nothing of the traffic, not that there is none."""
    silent: int = 0
    """How many gateways reported before but not recently (within ``SILENT_HOLD_S``): their
    requests are in no count here, so the sums are a floor of the traffic, not all of it.
    A gateway that stops cleanly removes its report and is not among them."""


SILENT_HOLD_S = 30.0
"""How long a gateway that stopped reporting without removing its report (it crashed, it
stalls, it cannot reach the database) counts as silent rather than gone: long enough for
its clients to reach another gateway, whose reports then carry their requests."""

NO_GATEWAYS = GatewaysInFlight(in_flight={}, routing_seen=None)


class FleetView(msgspec.Struct, frozen=True, kw_only=True):
    reports: dict[str, NodeReport] = {}
    in_flight: dict[str, int] = {}
    """Requests open on each replica, summed over the gateways that reported recently;
    a replica no gateway reports has none."""
    routing_seen: int | None = None
    """The lowest log position of the routing tables those gateways counted by: a change
    at or before it is in every live gateway's routing (None: unknown)."""
    silent_gateways: int = 0
    """Gateways silent but not yet gone (``GatewaysInFlight.silent``): what they have open,
    and which table they route by, is unknown."""
    left_routing: dict[str, int] = {}
    """Each stopping replica, with the fold's position when this leader first saw it out of
    routing (``app.domain.shard_commands.note_left_routing``): its leaving is at or before it."""
    hellos: int = 0
    """Hellos observed so far: the source of greeting numbers."""
    demand: dict[str, tuple[DemandSample, ...]] = {}
    """Each autoscaled model's demand, sampled every pass over its longest window
    (``app.domain.autoscale.observe``)."""
    traffic: dict[str, TrafficFigures] = {}
    """What the gateways measured of the replica groups this pass's rollout verdicts need
    (``app.domain.rollout_reads.traffic_wanted``), merged over the gateways that reported."""
    ejected: dict[str, int] = {}
    """The active replicas of models whose rollout holds a step, running or paused in it
    (``app.domain.hold_ejections.ejections_wanted``), that live gateways keep out of
    rotation for failing now, each with how many gateways do. A replica ejected by more of
    them than the log recorded in this hold is recorded (``app.domain.hold_ejections``),
    and the verdict counts what the log holds."""
    arrivals: Arrivals = Arrivals()
    """Agents arriving at the hub (hellos, connections opening): they keep the adoption
    grace open (``app.domain.adoption_grace``); put in by the reconciler."""
    disconnected: dict[str, str] = {}
    """Each node whose connection to this control plane ended, with why, until it says hello
    again (at most one entry for each node that ever said hello here)."""

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
            disconnected = {n: r for n, r in view.disconnected.items() if n != node.node_id}
            return msgspec.structs.replace(
                view,
                reports={**view.reports, node.node_id: node},
                hellos=hellos,
                disconnected=disconnected,
            )
        case HeartbeatReport():
            return _heartbeat(view, report)
        case ShardStatusReport():
            return _shard_status(view, report, model_of)
        case AgentDisconnected(node_id=node_id, reason=reason):
            if node_id not in view.reports:
                return view
            reports = {n: r for n, r in view.reports.items() if n != node_id}
            disconnected = {**view.disconnected, node_id: reason}
            return msgspec.structs.replace(view, reports=reports, disconnected=disconnected)
        case CommandAnswered(node_id=node_id, command_id=command_id):
            return command_settled(view, node_id, command_id)
        case _:
            return view


def command_sent(view: FleetView, node_id: str, command_id: str, at: datetime) -> FleetView:
    """The view once ``command_id`` is on its way to the node, sent ``at``: awaited until
    answered. A node that has not said hello is sent nothing: the view stays as it is. A
    command sent again while awaited keeps when it was first sent."""
    node = view.reports.get(node_id)
    if node is None or command_id in node.awaited:
        return view
    awaited = {**node.awaited, command_id: at}
    return _with_node(view, msgspec.structs.replace(node, awaited=awaited))


def command_settled(view: FleetView, node_id: str, command_id: str) -> FleetView:
    """The view once ``command_id`` is no longer awaited: the node answered it, or it could
    not be sent."""
    node = view.reports.get(node_id)
    if node is None or command_id not in node.awaited:
        return view
    awaited = {i: at for i, at in node.awaited.items() if i != command_id}
    return _with_node(view, msgspec.structs.replace(node, awaited=awaited))


def _heartbeat(view: FleetView, report: HeartbeatReport) -> FleetView:
    node = view.reports.get(report.node_id)
    if node is None:
        return view
    if report.gpu_memory:
        memory = {**node.gpu_memory_used_mib, **dict(report.gpu_memory)}
        if memory != node.gpu_memory_used_mib:
            node = msgspec.structs.replace(node, gpu_memory_used_mib=memory)
            view = _with_node(view, node)
    listed = {(replica_id, shard_index) for replica_id, shard_index, _ in report.shard_states}
    shards = {
        key: known
        for key, known in node.shards.items()
        if key in listed or known.running or known.stopped_by_agent
    }
    for replica_id, shard_index, state in report.shard_states:
        known = shards.get((replica_id, shard_index))
        if known is not None and known.state != state:
            failure = known.failure if state == ShardPhase.FAILED.value else None
            shards[(replica_id, shard_index)] = msgspec.structs.replace(
                known, state=state, failure=failure
            )
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
        stopped_by_agent=phase.phase is ShardPhase.STOPPED and phase.reason is not None,
    )
    if known == shard:
        return view
    return _with_shards(view, node, {**node.shards, key: shard})


def _with_shards(
    view: FleetView, node: NodeReport, shards: dict[ShardKey, ReportedShard]
) -> FleetView:
    return _with_node(view, msgspec.structs.replace(node, shards=shards))


def _with_node(view: FleetView, node: NodeReport) -> FleetView:
    return msgspec.structs.replace(view, reports={**view.reports, node.node_id: node})
