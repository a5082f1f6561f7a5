"""One line per event, in words: what ``history`` and the event tail show an operator."""

from __future__ import annotations

from typing import assert_never

from app.domain.autoscale_policy import AutoscalePolicy
from app.domain.events import (
    AnyEvent,
    ApiKeyCreated,
    ApiKeyRevoked,
    CertificateRevoked,
    EndedReplicasForgotten,
    GpuCordoned,
    GpuMarkedUnhealthy,
    GpuRecovered,
    GpuUncordoned,
    IdentityRejected,
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    ModelTuned,
    ModelUnplaceable,
    NodeConnected,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeForgotten,
    NodeLost,
    NodeRefused,
    NodeRegistered,
    NodeUncordoned,
    ReplacementServing,
    ReplicaAdopted,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    RolloutFinished,
    RolloutHoldEjectionSeen,
    RolloutHolding,
    RolloutPaused,
    RolloutResumed,
    RolloutRolledBack,
    RolloutStarted,
    RolloutStepStarted,
    RolloutVerdict,
    ShardFailed,
    ShardReady,
    ShardStarting,
    ShardStopped,
    StrayStopped,
)
from app.domain.keys import utc_text
from app.domain.revisions import FIRST_REVISION, describe_changes


def describe(event: AnyEvent) -> str:
    """The event as an operator reads it: what it is about, then what happened, so that a
    line in a tail of the whole log stands on its own."""
    return f"{_subject(event)} {_what(event)}"


def _subject(event: AnyEvent) -> str:
    match event:
        case (
            ModelDeclared()
            | ModelScaled()
            | ModelRemoved()
            | ModelUnplaceable()
            | EndedReplicasForgotten()
        ):
            return f"model {event.model}"
        case (
            RolloutStarted()
            | RolloutStepStarted()
            | RolloutHolding()
            | RolloutHoldEjectionSeen()
            | RolloutVerdict()
            | RolloutPaused()
            | RolloutResumed()
            | RolloutRolledBack()
            | RolloutFinished()
        ):
            return f"model {event.model} rollout {event.rollout_id}"
        case ModelTuned():
            return f"replica {event.replica_id}" if event.replica_id else f"model {event.model}"
        case IdentityRejected():
            return f"node {event.claimed_node_id}"
        case CertificateRevoked():
            return f"certificate {event.serial}" if event.serial else f"node {event.node_id}"
        case (
            NodeRegistered()
            | NodeConnected()
            | NodeDisconnected()
            | NodeLost()
            | NodeCordoned()
            | NodeUncordoned()
            | NodeDrainRequested()
            | NodeDrainCancelled()
            | NodeDrainFinished()
            | NodeForgotten()
            | GpuMarkedUnhealthy()
            | GpuRecovered()
            | GpuCordoned()
            | GpuUncordoned()
            | NodeRefused()
            | StrayStopped()
        ):
            return f"node {event.node_id}"
        case ApiKeyCreated():
            return f"key {event.name} ({event.prefix})"
        case ApiKeyRevoked(name=""):  # recorded before revocations named the key
            return f"key {event.key_id}"
        case ApiKeyRevoked():
            return f"key {event.name} ({event.prefix})"
        case _:
            return f"replica {event.replica_id}"


def _what(event: AnyEvent) -> str:
    match event:
        case ModelDeclared(spec=spec, changes=()):
            return (
                f"declared (revision {event.revision}): {spec.replicas} replica(s) x "
                f"{spec.shards_per_replica} shard(s) x {spec.gpus_per_shard} GPU(s), "
                f"engine {spec.engine}{_autoscaled(spec.autoscale)}"
            )
        case ModelDeclared():
            return f"revision {event.revision}: {describe_changes(event.changes)}"
        case ModelScaled(reason=""):
            return f"scaled from {event.previous} to {event.replicas} replica(s)"
        case ModelScaled():
            return f"scaled from {event.previous} to {event.replicas} replica(s): {event.reason}"
        case ModelRemoved():
            return "removed: every replica drains"
        case ModelTuned():
            return (
                f"tuned: weight {event.weight:g}, target_waiting {event.target_waiting}, "
                f"kv_ceiling {event.kv_ceiling:g}"
            )
        case ModelUnplaceable():
            return f"cannot place {event.missing_replicas} replica(s): {event.reason}"
        case NodeRegistered():
            return f"registered at {event.address} with {len(event.gpus)} GPU(s)"
        case NodeConnected():
            replaced = " (replaced an older connection)" if event.replaced_previous else ""
            return f"agent {event.agent_version} connected from {event.remote_address}{replaced}"
        case NodeDisconnected():
            return f"disconnected: {event.reason}"
        case NodeLost():
            return f"lost after {event.disconnected_for_s:.0f}s disconnected"
        case NodeCordoned():
            return f"cordoned{': ' + event.reason if event.reason else ''}"
        case NodeUncordoned():
            return "uncordoned"
        case NodeDrainRequested():
            return f"drain {event.drain_id} requested (grace {event.grace_s:.0f}s)"
        case NodeDrainCancelled():
            return f"drain {event.drain_id} cancelled: its moves are called off"
        case NodeDrainFinished():
            return f"drain {event.drain_id} finished: {event.outcome}"
        case NodeForgotten():
            return f"forgotten for good: {event.reason}"
        case GpuMarkedUnhealthy():
            return f"{_gpu(event.gpu_index, event.gpu_uuid)} unhealthy: {event.reason}"
        case GpuRecovered():
            return f"{_gpu(event.gpu_index, event.gpu_uuid)} healthy again"
        case GpuCordoned():
            reason = f": {event.reason}" if event.reason else ""
            return f"{_gpu(event.gpu_index, event.gpu_uuid)} cordoned{reason}"
        case GpuUncordoned():
            return f"{_gpu(event.gpu_index, event.gpu_uuid)} uncordoned"
        case IdentityRejected():
            return (
                f"refused a connection claiming it from {event.remote_address}: "
                f"{event.reason}{_suppressed(event.suppressed)}"
            )
        case NodeRefused():
            return (
                f"refused its connection from {event.remote_address}: "
                f"{event.reason}{_suppressed(event.suppressed)}"
            )
        case CertificateRevoked():
            if event.serial is not None:
                return f"revoked: {event.reason}"
            return f"certificates issued until now revoked: {event.reason}"
        case StrayStopped():
            return (
                f"stopped stray shard {event.replica_id}/{event.shard_index} on port "
                f"{event.port}: {event.rule}"
            )
        case ReplicaPlaced():
            where = ", ".join(
                f"{s.node_id} GPUs {','.join(map(str, s.gpus))} port {s.port}" for s in event.shards
            )
            # A drain's replacement already names the original in its reason.
            named = event.replaces is None or event.replaces in event.reason
            replaces = "" if named else f", replacing {event.replaces}"
            # The first revision is the rule; a later one is worth the words.
            revision = f", revision {event.revision}" if event.revision != FIRST_REVISION else ""
            return f"placed on {where} ({event.reason}{replaces}){revision}"
        case ShardStarting():
            pid = f" pid {event.pid}" if event.pid is not None else ""
            return f"shard {event.shard_index} starting on {event.node_id}{pid}"
        case ShardReady():
            return f"shard {event.shard_index} ready on {event.node_id}"
        case ShardFailed():
            code = f" (exit {event.exit_code})" if event.exit_code is not None else ""
            return f"shard {event.shard_index} failed on {event.node_id}{code}: {event.error}"
        case ShardStopped(reason=None):
            return f"shard {event.shard_index} stopped on {event.node_id}"
        case ShardStopped():
            return f"shard {event.shard_index} stopped by {event.node_id}: {event.reason}"
        case ReplicaServing():
            return "serving"
        case ReplicaFailed():
            return f"failed: {event.reason}"
        case ReplicaDrainStarted():
            return f"draining (drain {event.drain_id}){': ' + event.reason if event.reason else ''}"
        case ReplacementServing():
            return f"replacement {event.replacement_id} is serving"
        case ReplicaStopping():
            return f"out of routing, stopping: {event.reason}"
        case ReplicaStopped():
            return "stopped"
        case ReplicaStartupTimedOut():
            return event.reason
        case ReplicaAdopted():
            return (
                f"shard {event.shard_index} adopted on {event.node_id} port {event.port}: "
                f"{event.rule}"
            )
        case ReplicaLost():
            return f"lost: {event.reason}"
        case EndedReplicasForgotten():
            return (
                f"forgot its {event.replicas} replica(s) that ended at or before "
                f"{utc_text(event.before)}"
            )
        case RolloutStarted():
            undoing = f", undoing {event.undoes}" if event.undoes is not None else ""
            return f"started: revision {event.from_revision} -> {event.revision}{undoing}"
        case RolloutStepStarted():
            share = f", {event.traffic:.0%} of the traffic" if event.traffic is not None else ""
            hold = f", hold {event.hold_s:g}s" if event.hold_s else ""
            count = f"{event.replicas} replica(s) of the new revision"
            return f"step {event.step + 1}: {count}{share}{hold}"
        case RolloutHolding():
            return f"step {event.step + 1} holds for {event.hold_s:g}s"
        case RolloutHoldEjectionSeen():
            return (
                f"step {event.step + 1}: replica {event.replica_id} ejected by "
                f"{event.gateways} gateway(s) at once during the hold"
            )
        case RolloutVerdict():
            return f"step {event.step + 1} verdict {event.verdict}: {event.reason}"
        case RolloutPaused():
            return f"paused: {event.reason}"
        case RolloutResumed():
            return "resumed"
        case RolloutRolledBack():
            return f"rolled back to revision {event.to_revision}: {event.reason}"
        case RolloutFinished():
            return f"{'succeeded' if event.succeeded else 'finished'}: {event.outcome}"
        case ReplicaDrainCancelled():
            return f"move {event.drain_id} called off: {event.reason}"
        case ApiKeyCreated():
            scope = ", ".join(event.models) if event.models else "all models"
            expires = f", expires {utc_text(event.expires_at)}" if event.expires_at else ""
            return f"created for {scope}{expires}"
        case ApiKeyRevoked():
            return "revoked"
        case _:
            assert_never(event)


def _autoscaled(policy: AutoscalePolicy | None) -> str:
    """How a declaration scales the model: an autoscale policy turned on, changed or off
    is a declaration of the same revision, told apart from another only by this."""
    if policy is None:
        return ""
    return f", autoscaled {policy.min_replicas}..{policy.max_replicas} replica(s)"


def _suppressed(count: int) -> str:
    return f" ({count} more like it since the last one recorded)" if count else ""


def _gpu(index: int, uuid: str) -> str:
    """A GPU of a node's history: its index, and its UUID (in full, as the node's GPUs in
    the admin API and ``nvidia-smi -L`` give it) when the event names one, since a driver
    reload may list the same GPU under another index. Events recorded before GPU events
    named a UUID have none, and say only the index."""
    return f"GPU {index} ({uuid})" if uuid else f"GPU {index}"
