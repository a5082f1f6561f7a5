"""The agent hub's edge: every conversion between the wire and the domain, in one place.

Inward, what a session observed (``app.hub.session``, wire messages inside) becomes an
``app.domain.reports.AgentReport``; outward, a domain command becomes the wire message the
agent receives. Nothing past the hub sees a wire type, and the wire never sees a domain
one, so either can change without the other.
"""

from __future__ import annotations

from typing import assert_never

from app.domain import commands
from app.domain.events import GpuInfo
from app.domain.reports import (
    AgentConnected,
    AgentDisconnected,
    AgentInventory,
    AgentReport,
    CommandAnswered,
    GpuHealth,
    HeartbeatReport,
    IdentityClaim,
    Refusal,
    ReportedPhase,
    ReportedShard,
    ShardPhaseReport,
    ShardStatusReport,
)
from app.domain.state import ShardPhase
from app.hub.session import (
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    CommandCompleted,
    ConnectionRefused,
    IdentityMismatch,
    Observation,
    ShardStatusReported,
)
from wire import messages as wire


def report_of(observation: Observation, *, replaced_previous: bool = False) -> AgentReport:
    """``observation`` in domain terms; ``replaced_previous`` goes with a hello that came on
    a connection that took over from an older one of the same node."""
    match observation:
        case AgentHello(hello=hello, remote_address=remote, certificate_serial=serial):
            return AgentConnected(
                inventory=_inventory(hello, remote, serial),
                shards=tuple(_reported_shard(shard) for shard in hello.shards),
                replaced_previous=replaced_previous,
            )
        case AgentHeartbeat(node_id=node_id, heartbeat=heartbeat):
            return HeartbeatReport(
                node_id=node_id,
                gpu_changes=tuple(_gpu_health(change) for change in heartbeat.gpu_changes),
                shard_states=tuple(
                    (s.replica_id, s.shard_index, s.state) for s in heartbeat.shards
                ),
                gpu_memory=tuple((r.index, r.used_mib) for r in heartbeat.gpu_memory),
            )
        case ShardStatusReported(node_id=node_id, status=status):
            return ShardStatusReport(
                node_id=node_id,
                phase=_phase(status),
                port=status.port,
                command_id=status.command_id,
            )
        case AgentGone(node_id=node_id, reason=reason):
            return AgentDisconnected(node_id=node_id, reason=reason)
        case CommandCompleted(node_id=node_id, result=result, sent=sent):
            return CommandAnswered(
                node_id=node_id,
                command_id=result.command_id,
                ok=result.ok,
                error=result.error,
                sent=sent,
            )
        case IdentityMismatch():
            return IdentityClaim(
                claimed_node_id=observation.claimed_node_id,
                certificate_subject=observation.certificate_subject,
                remote_address=observation.remote_address,
                reason=observation.reason,
                suppressed=observation.suppressed,
            )
        case ConnectionRefused():
            return Refusal(
                node_id=observation.node_id,
                remote_address=observation.remote_address,
                certificate_serial=observation.certificate_serial,
                reason=observation.reason,
                suppressed=observation.suppressed,
            )
        case _:
            assert_never(observation)


def command_to_wire(command: commands.StartShard | commands.StopShard) -> wire.AgentCommand:
    """The domain's command as the agent channel carries it."""
    match command:
        case commands.StartShard():
            return wire.StartShard(
                command_id=command.command_id,
                replica_id=command.replica_id,
                shard_index=command.shard_index,
                model=command.model,
                argv=command.argv,
                env=dict(command.env),
                gpus=command.gpus,
                port=command.port,
                peers=tuple(
                    wire.Peer(shard_index=p.shard_index, address=p.address, port=p.port)
                    for p in command.peers
                ),
                engine=command.engine,
            )
        case commands.StopShard():
            return wire.StopShard(
                command_id=command.command_id,
                replica_id=command.replica_id,
                shard_index=command.shard_index,
                grace_s=command.grace_s,
            )
        case _:
            assert_never(command)


def _inventory(hello: wire.Hello, remote_address: str, serial: str) -> AgentInventory:
    return AgentInventory(
        node_id=hello.node_id,
        address=hello.address,
        remote_address=remote_address,
        labels=dict(hello.labels),
        gpus=tuple(_gpu_info(gpu) for gpu in hello.gpus),
        port_range=hello.port_range,
        agent_version=hello.agent_version,
        certificate_serial=serial,
    )


def _reported_shard(shard: wire.ShardReport) -> ReportedShard:
    return ReportedShard(
        replica_id=shard.replica_id,
        shard_index=shard.shard_index,
        model=shard.model,
        port=shard.port,
        pid=shard.pid,
        state=shard.state,
        failure=shard.failure if shard.state == "failed" else None,
    )


def _gpu_info(gpu: wire.GpuReport) -> GpuInfo:
    return GpuInfo(
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        memory_total_mib=gpu.memory_total_mib,
        memory_used_mib=gpu.memory_used_mib,
        healthy=gpu.healthy,
        unhealthy_reason=gpu.unhealthy_reason,
    )


def _gpu_health(change: wire.GpuHealthChange) -> GpuHealth:
    return GpuHealth(
        index=change.index,
        uuid=change.uuid,
        healthy=change.healthy,
        reason=change.reason,
        xid=change.xid,
    )


def _phase(status: wire.ShardStatus) -> ShardPhaseReport:
    return ShardPhaseReport(
        replica_id=status.replica_id,
        shard_index=status.shard_index,
        phase=_PHASES[status.state],
        pid=status.pid,
        error=status.error,
        exit_code=status.exit_code,
        log_tail=status.log_tail,
        reason=status.reason if status.state == "stopped" else None,
        port_held_elsewhere=status.port_held_elsewhere is True and status.state == "failed",
    )


_PHASES: dict[str, ReportedPhase] = {
    "starting": ShardPhase.STARTING,
    "ready": ShardPhase.READY,
    "failed": ShardPhase.FAILED,
    "stopped": ShardPhase.STOPPED,
}
