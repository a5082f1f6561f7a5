"""What agents report, in domain terms: the agent hub converts each wire message to one of
these at its edge (``app.hub.edge``), and nothing past it sees the wire.

The log's decisions (``app.domain.agent_reports``) and the live fleet view
(``app.domain.fleet_view``) both fold them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from app.domain.events import GpuInfo
from app.domain.state import ShardPhase

RUNNING_STATES = frozenset({"starting", "ready"})


class ReportedShard(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    shard_index: int
    model: str
    port: int
    pid: int | None
    state: str

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
    """GPU health changes since the last heartbeat, and the state of every shard."""

    node_id: str
    gpu_changes: tuple[GpuHealth, ...] = ()
    shard_states: tuple[tuple[str, int, str], ...] = ()
    """``(replica_id, shard_index, state)`` of every shard the agent runs."""


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
    """An agent's result for one command: logged, not recorded (its effect comes as a
    status)."""

    node_id: str
    command_id: str
    ok: bool
    error: str | None = None


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
