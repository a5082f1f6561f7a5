"""What the agents' reports mean for the log: pure decisions, no I/O.

``decide(state, report)`` takes the cluster as the log describes it and one thing an agent
said (``app.domain.reports``: the agent hub converts the wire messages at its edge) and
returns the events to append, as ``(stream, event)`` pairs in order. A report that changes
nothing returns no events, so an agent repeating itself never grows the log. A command's
answer records something only when it is a start its node refused
(``app.domain.start_refusals``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

import msgspec

from app.domain.events import (
    AnyEvent,
    GpuMarkedUnhealthy,
    GpuRecovered,
    IdentityRejected,
    NodeConnected,
    NodeDisconnected,
    NodeRefused,
    NodeRegistered,
    ShardFailed,
    ShardReady,
    ShardStarting,
    ShardStopped,
    node_stream,
    replica_stream,
)
from app.domain.gpu_identity import known_as, same_gpu
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
    ShardPhaseReport,
    ShardStatusReport,
)
from app.domain.start_refusals import refused_start
from app.domain.state import ClusterState, ShardPhase, stray_key

Decision = list[tuple[str, AnyEvent]]


def decide(state: ClusterState, report: AgentReport) -> Decision:
    """The events ``report`` adds to what the log says."""
    match report:
        case AgentConnected(inventory=inventory, replaced_previous=replaced):
            return agent_connected(state, inventory, replaced_previous=replaced)
        case HeartbeatReport(node_id=node_id, gpu_changes=changes):
            return gpu_health_reported(state, node_id, changes)
        case ShardStatusReport(node_id=node_id, phase=phase, port=port):
            return shard_reported(state, node_id, phase, port=port)
        case AgentDisconnected(node_id=node_id, reason=reason):
            return agent_gone(state, node_id, reason)
        case IdentityClaim():
            return identity_rejected(report)
        case Refusal():
            return node_refused(report)
        case CommandAnswered():
            return list(refused_start(state, report))
        case _:
            assert_never(report)


def agent_connected(
    state: ClusterState, inventory: AgentInventory, *, replaced_previous: bool
) -> Decision:
    """Registered the first time the node is seen, then connected with its inventory, plus
    a GPU event for every GPU whose health differs from what the log knew: a GPU the log
    knew unhealthy when an earlier hello left it out included (``Node.unlisted_gpus``).

    A GPU is known by its UUID (``app.domain.gpu_identity``): after a driver reload
    numbered the GPUs anew, one listed under another index is judged against what the log
    knew of it there, and another GPU listed under its old index as a GPU the log never
    knew (healthy until now, so only a fault of it is recorded)."""
    stream = node_stream(inventory.node_id)
    known = state.nodes.get(inventory.node_id)
    decision: Decision = []
    if known is None:
        decision.append(
            (
                stream,
                NodeRegistered(
                    node_id=inventory.node_id,
                    address=inventory.address,
                    labels=inventory.labels,
                    gpus=inventory.gpus,
                    agent_version=inventory.agent_version,
                    port_range=inventory.port_range,
                ),
            )
        )
    decision.append(
        (
            stream,
            NodeConnected(
                node_id=inventory.node_id,
                address=inventory.address,
                remote_address=inventory.remote_address,
                labels=inventory.labels,
                gpus=inventory.gpus,
                agent_version=inventory.agent_version,
                port_range=inventory.port_range,
                replaced_previous=replaced_previous,
                certificate_serial=inventory.certificate_serial,
            ),
        )
    )
    # A GPU an earlier hello left out while unhealthy is judged against that fault, so that
    # its return healthy is recorded as its recovery. The node's GPUs are searched first,
    # then those left out, the latest left out first.
    previous = (*known.gpus, *reversed(known.unlisted_gpus)) if known is not None else ()
    listed_uuids = frozenset(g.uuid for g in inventory.gpus if g.uuid)
    for listed in inventory.gpus:
        gpu = GpuHealth(
            index=listed.index,
            uuid=listed.uuid,
            healthy=listed.healthy,
            reason=listed.unhealthy_reason,
        )
        was = known_as(gpu, previous, listed_uuids)
        event = _health_event(
            inventory.node_id, gpu, (was.healthy, was.unhealthy_reason) if was else (True, None)
        )
        if event is not None:
            decision.append((stream, event))
    return decision


def gpu_health_reported(
    state: ClusterState, node_id: str, changes: Sequence[GpuHealth]
) -> Decision:
    """GPU events for the reported changes that the log does not know yet. A change about a
    GPU the node does not list under that index (another index, or another GPU's UUID under
    it: the hub passes on neither) is ignored: its next hello brings it in with its
    health."""
    node = state.nodes.get(node_id)
    if node is None:
        return []
    listed = {gpu.index: gpu for gpu in node.gpus}
    health = {gpu.index: (gpu.healthy, gpu.unhealthy_reason) for gpu in node.gpus}
    stream = node_stream(node_id)
    decision: Decision = []
    for change in changes:
        gpu = listed.get(change.index)
        if gpu is None or not same_gpu(gpu, index=change.index, uuid=change.uuid):
            continue
        event = _health_event(node_id, change, health[change.index])
        if event is None:
            continue
        health[change.index] = (
            (False, event.reason) if isinstance(event, GpuMarkedUnhealthy) else (True, None)
        )
        decision.append((stream, event))
    return decision


def shard_reported(
    state: ClusterState, node_id: str, report: ShardPhaseReport, *, port: int
) -> Decision:
    """The shard's new phase, if the log places that shard on this node and its phase
    changes. A report about a shard the log does not place here is left for the
    reconciler, which decides what to do with strays; so is an engine running at another
    ``port`` than the log's: it is not the copy the log placed, and adoption decides
    whether it takes that copy's place. An engine of the shard that ends is recorded at
    any port (an agent runs one engine per shard, so none runs at the log's port either),
    except one the log has stopped as a stray on this node (``StrayStopped``, known by its
    pid): that end is the stop adoption asked for, not news of the log's copy, which must
    not fail "stopped without being asked to" for it. Whether anything of the shard still
    runs is the node's next report's to say.

    A shard of a replica that has ended records only the end of its engine, once, as the
    fold takes it (``Replica.takes_shard_news``): anything else would be passed over there,
    so an agent repeating it would grow the log for nothing."""
    shard = state.shard(report.replica_id, report.shard_index)
    if shard is None:
        return []
    if shard.node_id != node_id or shard.phase is report.phase:
        return []
    if not state.replicas[report.replica_id].takes_shard_news(shard, report.phase):
        return []
    if port != shard.port and (
        report.phase in _RUNNING or _stopped_as_stray(state, node_id, report)
    ):
        return []
    return [(replica_stream(report.replica_id), _shard_event(node_id, report))]


def _stopped_as_stray(state: ClusterState, node_id: str, report: ShardPhaseReport) -> bool:
    node = state.nodes.get(node_id)
    key = stray_key(report.replica_id, report.shard_index, report.pid)
    return node is not None and key in node.stray_stops


_RUNNING = frozenset({ShardPhase.STARTING, ShardPhase.READY})


def _shard_event(node_id: str, report: ShardPhaseReport) -> AnyEvent:
    replica_id, index = report.replica_id, report.shard_index
    match report.phase:
        case ShardPhase.STARTING:
            return ShardStarting(
                replica_id=replica_id, shard_index=index, node_id=node_id, pid=report.pid
            )
        case ShardPhase.READY:
            return ShardReady(replica_id=replica_id, shard_index=index, node_id=node_id)
        case ShardPhase.FAILED:
            return ShardFailed(
                replica_id=replica_id,
                shard_index=index,
                node_id=node_id,
                error=report.error or _unexplained_failure(report.exit_code),
                exit_code=report.exit_code,
                log_tail=report.log_tail,
                port_held_elsewhere=True if report.port_held_elsewhere else msgspec.UNSET,
            )
        case ShardPhase.STOPPED:
            return ShardStopped(
                replica_id=replica_id,
                shard_index=index,
                node_id=node_id,
                exit_code=report.exit_code,
                log_tail=report.log_tail,
                reason=report.reason,
            )


def identity_rejected(claim: IdentityClaim) -> Decision:
    """Recorded on the claimed node's stream for the audit trail; it changes no state."""
    return [
        (
            node_stream(claim.claimed_node_id),
            IdentityRejected(
                claimed_node_id=claim.claimed_node_id,
                certificate_subject=claim.certificate_subject,
                remote_address=claim.remote_address,
                reason=claim.reason,
                suppressed=claim.suppressed,
            ),
        )
    ]


def node_refused(refusal: Refusal) -> Decision:
    """Recorded on the node's stream for the audit trail; it changes no state."""
    return [
        (
            node_stream(refusal.node_id),
            NodeRefused(
                node_id=refusal.node_id,
                remote_address=refusal.remote_address,
                certificate_serial=refusal.certificate_serial,
                reason=refusal.reason,
                suppressed=refusal.suppressed,
            ),
        )
    ]


def agent_gone(state: ClusterState, node_id: str, reason: str) -> Decision:
    node = state.nodes.get(node_id)
    if node is None or not node.connected:
        return []
    return [(node_stream(node_id), NodeDisconnected(node_id=node_id, reason=reason))]


def _health_event(
    node_id: str, gpu: GpuHealth, was: tuple[bool, str | None]
) -> GpuRecovered | GpuMarkedUnhealthy | None:
    """The event that says ``gpu`` is no longer as the log knew it (``was``: healthy, and
    the reason it was not), if its health differs or it is unhealthy for another reason (a
    new fault, or held as flapping, is news to an operator)."""
    was_healthy, was_reason = was
    reason = gpu.reason or "reported unhealthy without a reason"
    if gpu.healthy == was_healthy and (gpu.healthy or reason == was_reason):
        return None
    if gpu.healthy:
        return GpuRecovered(node_id=node_id, gpu_index=gpu.index, gpu_uuid=gpu.uuid)
    return GpuMarkedUnhealthy(
        node_id=node_id, gpu_index=gpu.index, gpu_uuid=gpu.uuid, reason=reason, xid=gpu.xid
    )


def _unexplained_failure(exit_code: int | None) -> str:
    if exit_code is None:
        return "failed without a reason"
    return f"exited with code {exit_code}"
