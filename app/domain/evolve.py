"""The fold: ``evolve(state, recorded) -> state``, the only place state changes.

The same function builds the control plane's view at start-up and the SQL projection
rows, so the two cannot disagree. It updates ``state``'s maps in place and returns it: a
replay folds a million events and cannot afford to copy four maps per event. Entities are
frozen and replaced, never mutated, so anyone holding one (or a ``state.copy()``) keeps a
consistent picture. Events about an entity the state does not know leave it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, assert_never

from msgspec.structs import replace

from app.domain.envelope import Recorded
from app.domain.events import (
    ApiKeyCreated,
    ApiKeyRevoked,
    GpuMarkedUnhealthy,
    GpuRecovered,
    IdentityRejected,
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    ModelTuned,
    ModelUnplaceable,
    NodeConnected,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    ReplacementServing,
    ReplicaAdopted,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    ShardFailed,
    ShardReady,
    ShardStarting,
    ShardStopped,
    StrayStopped,
)
from app.domain.model_spec import RoutingSettings
from app.domain.state import (
    STRAYS_REMEMBERED,
    ApiKey,
    ClusterState,
    Model,
    Node,
    Replica,
    ReplicaPhase,
    Shard,
    ShardPhase,
    backoff_s,
)


def replay(events: Iterable[Recorded], state: ClusterState | None = None) -> ClusterState:
    """Fold ``events`` into ``state`` (a fresh one by default)."""
    state = state if state is not None else ClusterState()
    for recorded in events:
        evolve(state, recorded)
    return state


def evolve(state: ClusterState, recorded: Recorded) -> ClusterState:
    at = recorded.recorded_at
    event = recorded.event
    state.position = recorded.position
    match event:
        # Shard and replica events come first: they are most of any log.
        case ShardStarting():
            _update_shard(
                state,
                event.replica_id,
                event.shard_index,
                {"phase": ShardPhase.STARTING, "pid": event.pid},
                replica_changes=_starting(state, event.replica_id, at),
            )
        case ShardReady():
            _update_shard(
                state,
                event.replica_id,
                event.shard_index,
                {"phase": ShardPhase.READY, "came_up": True},
            )
        case ShardFailed():
            _update_shard(
                state,
                event.replica_id,
                event.shard_index,
                {
                    "phase": ShardPhase.FAILED,
                    "error": event.error,
                    "exit_code": event.exit_code,
                    "log_tail": event.log_tail,
                },
            )
        case ShardStopped():
            _update_shard(
                state,
                event.replica_id,
                event.shard_index,
                {"phase": ShardPhase.STOPPED, "exit_code": event.exit_code},
            )
        case ReplicaPlaced():
            state.replicas[event.replica_id] = Replica(
                id=event.replica_id,
                model=event.model,
                number=event.number,
                phase=ReplicaPhase.PLACED,
                shards=tuple(
                    Shard(
                        index=s.index,
                        node_id=s.node_id,
                        gpus=s.gpus,
                        port=s.port,
                        epoch=recorded.meta.epoch,
                    )
                    for s in event.shards
                ),
                placed_at=at,
                reason=event.reason,
                replaces=event.replaces,
            )
            model = state.models.get(event.model)
            if model is not None:
                state.models[event.model] = replace(
                    model,
                    replicas_created=max(model.replicas_created, event.number),
                    unplaceable_reason=None,
                )
        case ReplicaServing():
            _update_replica(
                state,
                event.replica_id,
                phase=ReplicaPhase.SERVING,
                serving_since=at,
                routable=True,
            )
            _model_of(state, event.replica_id, failures=0, backoff_until=None)
        case ReplicaDrainStarted():
            _update_replica(
                state,
                event.replica_id,
                phase=ReplicaPhase.DRAINING,
                drain_id=event.drain_id,
                drain_started_at=at,
            )
        case ReplacementServing():
            _update_replica(state, event.replica_id, replacement_id=event.replacement_id)
        case ReplicaStopping():
            _update_replica(
                state,
                event.replica_id,
                phase=ReplicaPhase.STOPPING,
                routable=False,
                stopping_since=at,
                end_reason=event.reason,
            )
        case ReplicaStopped():
            _end_replica(state, event.replica_id, ReplicaPhase.STOPPED, at, None)
        case ReplicaFailed():
            _end_replica(state, event.replica_id, ReplicaPhase.FAILED, at, event.reason)
            _count_failure(state, event.replica_id, at)
        case ReplicaStartupTimedOut():
            reason = f"not ready after {event.waited_s:.0f}s (timeout {event.timeout_s:.0f}s)"
            _end_replica(state, event.replica_id, ReplicaPhase.TIMED_OUT, at, reason)
            _count_failure(state, event.replica_id, at)
        case ReplicaLost():
            _end_replica(state, event.replica_id, ReplicaPhase.LOST, at, event.reason)
        case ReplicaAdopted():
            shard_phase = ShardPhase.READY if event.ready else ShardPhase.STARTING
            _update_shard(
                state,
                event.replica_id,
                event.shard_index,
                {
                    "node_id": event.node_id,
                    "port": event.port,
                    "pid": event.pid,
                    "phase": shard_phase,
                    "came_up": event.ready,
                    "epoch": recorded.meta.epoch,
                },
                replica_changes=_starting(state, event.replica_id, at),
            )
        # Nodes.
        case NodeRegistered():
            state.nodes[event.node_id] = Node(
                id=event.node_id,
                address=event.address,
                registered_at=at,
                labels=event.labels,
                gpus=event.gpus,
                agent_version=event.agent_version,
                port_range=event.port_range,
                last_change_at=at,
            )
        case NodeConnected():
            node = state.nodes.get(event.node_id) or Node(
                id=event.node_id, address=event.address, registered_at=at
            )
            state.nodes[event.node_id] = replace(
                node,
                address=event.address,
                remote_address=event.remote_address,
                labels=event.labels,
                gpus=event.gpus,
                agent_version=event.agent_version,
                port_range=event.port_range,
                connected=True,
                lost=False,
                last_change_at=at,
            )
        case NodeDisconnected():
            _update_node(state, event.node_id, connected=False, last_change_at=at)
        case NodeLost():
            _update_node(state, event.node_id, connected=False, lost=True, last_change_at=at)
        case NodeCordoned():
            _update_node(state, event.node_id, cordoned=True, cordon_reason=event.reason)
        case NodeUncordoned():
            _update_node(
                state,
                event.node_id,
                cordoned=False,
                cordon_reason=None,
                drain_id=None,
                drain_grace_s=None,
                drain_requested_at=None,
            )
        case NodeDrainRequested():
            _update_node(
                state,
                event.node_id,
                cordoned=True,
                cordon_reason=f"drain {event.drain_id}",
                drain_id=event.drain_id,
                drain_grace_s=event.grace_s,
                drain_requested_at=at,
            )
        case NodeDrainFinished():
            _update_node(
                state, event.node_id, drain_id=None, drain_grace_s=None, drain_requested_at=None
            )
        case GpuMarkedUnhealthy():
            _update_gpu(
                state, event.node_id, event.gpu_index, healthy=False, unhealthy_reason=event.reason
            )
        case GpuRecovered():
            _update_gpu(state, event.node_id, event.gpu_index, healthy=True, unhealthy_reason=None)
        case StrayStopped():
            _remember_stray(state, event)
        case IdentityRejected():
            pass  # recorded for the audit trail; a refused connection is not state
        # Models.
        case ModelDeclared():
            known = state.models.get(event.model)
            if known is None or known.removed:
                state.models[event.model] = Model(
                    name=event.model,
                    spec=event.spec,
                    declared_at=at,
                    replicas_created=known.replicas_created if known else 0,
                )
            else:
                state.models[event.model] = replace(known, spec=event.spec)
        case ModelScaled():
            model = state.models.get(event.model)
            if model is not None:
                spec = replace(model.spec, replicas=event.replicas)
                state.models[event.model] = replace(model, spec=spec)
        case ModelRemoved():
            _update_model(state, event.model, removed=True)
        case ModelTuned():
            _tune(state, event, at)
        case ModelUnplaceable():
            _update_model(state, event.model, unplaceable_reason=event.reason)
        # API keys.
        case ApiKeyCreated():
            state.keys[event.key_id] = ApiKey(
                id=event.key_id,
                name=event.name,
                prefix=event.prefix,
                secret_hash=event.secret_hash,
                models=event.models,
                rpm=event.rpm,
                tpm=event.tpm,
                created_at=at,
                created_by=recorded.meta.actor,
            )
        case ApiKeyRevoked():
            key = state.keys.get(event.key_id)
            if key is not None and key.revoked_at is None:
                state.keys[event.key_id] = replace(
                    key, revoked_at=at, revoked_by=recorded.meta.actor
                )
        case _:
            assert_never(event)
    return state


def _starting(state: ClusterState, replica_id: str, at: datetime) -> dict[str, Any]:
    replica = state.replicas.get(replica_id)
    if replica is None or replica.phase is not ReplicaPhase.PLACED:
        return {}
    return {"phase": ReplicaPhase.STARTING, "starting_since": at}


def _update_shard(
    state: ClusterState,
    replica_id: str,
    index: int,
    changes: dict[str, Any],
    replica_changes: dict[str, Any] | None = None,
) -> None:
    replica = state.replicas.get(replica_id)
    if replica is None or not 0 <= index < len(replica.shards):
        return
    shards = list(replica.shards)
    shards[index] = replace(shards[index], **changes)
    state.replicas[replica_id] = replace(replica, shards=tuple(shards), **(replica_changes or {}))


def _update_replica(state: ClusterState, replica_id: str, **changes: Any) -> None:
    replica = state.replicas.get(replica_id)
    if replica is not None:
        state.replicas[replica_id] = replace(replica, **changes)


def _end_replica(
    state: ClusterState,
    replica_id: str,
    phase: ReplicaPhase,
    at: datetime,
    reason: str | None,
) -> None:
    replica = state.replicas.get(replica_id)
    if replica is None:
        return
    state.replicas[replica_id] = replace(
        replica,
        phase=phase,
        routable=False,
        ended_at=at,
        end_reason=reason if reason is not None else replica.end_reason,
    )


def _remember_stray(state: ClusterState, event: StrayStopped) -> None:
    node = state.nodes.get(event.node_id)
    if node is not None:
        key = f"{event.replica_id}/{event.shard_index}/{event.pid}"
        strays = (*node.stray_stops, key)[-STRAYS_REMEMBERED:]
        state.nodes[event.node_id] = replace(node, stray_stops=strays)


def _model_of(state: ClusterState, replica_id: str, **changes: Any) -> None:
    replica = state.replicas.get(replica_id)
    if replica is not None:
        _update_model(state, replica.model, **changes)


def _count_failure(state: ClusterState, replica_id: str, at: datetime) -> None:
    replica = state.replicas.get(replica_id)
    model = state.models.get(replica.model) if replica else None
    if model is not None:
        failures = model.failures + 1
        until = at + timedelta(seconds=backoff_s(failures))
        state.models[model.name] = replace(model, failures=failures, backoff_until=until)


def _update_node(state: ClusterState, node_id: str, **changes: Any) -> None:
    node = state.nodes.get(node_id)
    if node is not None:
        state.nodes[node_id] = replace(node, **changes)


def _update_gpu(state: ClusterState, node_id: str, index: int, **changes: Any) -> None:
    node = state.nodes.get(node_id)
    if node is None:
        return
    gpus = tuple(replace(g, **changes) if g.index == index else g for g in node.gpus)
    state.nodes[node_id] = replace(node, gpus=gpus)


def _update_model(state: ClusterState, name: str, **changes: Any) -> None:
    model = state.models.get(name)
    if model is not None:
        state.models[name] = replace(model, **changes)


def _tune(state: ClusterState, event: ModelTuned, at: datetime) -> None:
    routing = RoutingSettings(
        weight=event.weight, target_waiting=event.target_waiting, kv_ceiling=event.kv_ceiling
    )
    if event.replica_id is not None:
        _update_replica(state, event.replica_id, routing=routing)
        return
    model = state.models.get(event.model)
    if model is not None:
        spec = replace(model.spec, routing=routing)
        state.models[event.model] = replace(model, spec=spec, tuned_summary=dict(event.summary))
