"""The fold: ``evolve(state, recorded) -> state``, the only place state changes.

The same function builds the control plane's view at start-up and the SQL projection
rows, so the two cannot disagree. It updates ``state``'s maps in place and returns it: a
replay folds a million events and cannot afford to copy four maps per event. Entities are
frozen and replaced, never mutated, so anyone holding one (or a ``state.copy()``) keeps a
consistent picture. Events about an entity the state does not know leave it unchanged.

The fold keeps the live cluster, not its whole history: once more than
``ENDED_KEPT_PER_MODEL`` replicas of a model have ended, the one that ended first is
forgotten (``_keep_ended``), so the state, its snapshots and a start-up stay the size of the
cluster however long the log. Events about a forgotten replica leave the state unchanged,
like events about one it never knew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from msgspec.structs import replace

from app.domain.changes import (
    GpuChanges,
    ModelChanges,
    NodeChanges,
    ReplicaChanges,
    RolloutChanges,
    ShardChanges,
)
from app.domain.envelope import Recorded
from app.domain.events import (
    ApiKeyCreated,
    ApiKeyRevoked,
    CertificateRevoked,
    Event,
    GpuInfo,
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
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.state import (
    ACTIVE_PHASES,
    ENDED_KEPT_PER_MODEL,
    ENDED_PHASES,
    STRAYS_REMEMBERED,
    ApiKey,
    CertificateRevocation,
    ClusterState,
    Model,
    Move,
    Node,
    Replica,
    ReplicaPhase,
    Rollout,
    RolloutState,
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
    state.position = recorded.position
    event = recorded.event
    _HANDLERS[type(event)](state, event, recorded)
    return state


def _shard_starting(state: ClusterState, event: ShardStarting, recorded: Recorded) -> None:
    at = recorded.recorded_at
    changes: ShardChanges = {"phase": ShardPhase.STARTING, "pid": event.pid, "stop_reason": None}
    if _restarted(state, event) and recorded.meta.epoch is not None:
        # Restarted where it was placed, by the leader of this epoch: nothing to adopt.
        changes["epoch"] = recorded.meta.epoch
    _update_shard(
        state,
        event.replica_id,
        event.shard_index,
        changes,
        replica_changes=_starting(state, event.replica_id, at),
    )


def _restarted(state: ClusterState, event: ShardStarting) -> bool:
    """Whether the shard starts again after its agent stopped it on purpose."""
    replica = state.replicas.get(event.replica_id)
    if replica is None or not 0 <= event.shard_index < len(replica.shards):
        return False
    return replica.shards[event.shard_index].stopped_by_agent


def _shard_ready(state: ClusterState, event: ShardReady, recorded: Recorded) -> None:
    _update_shard(
        state,
        event.replica_id,
        event.shard_index,
        {"phase": ShardPhase.READY, "came_up": True, "stop_reason": None},
    )


def _shard_failed(state: ClusterState, event: ShardFailed, recorded: Recorded) -> None:
    _update_shard(
        state,
        event.replica_id,
        event.shard_index,
        {
            "phase": ShardPhase.FAILED,
            "error": event.error,
            "exit_code": event.exit_code,
            "log_tail": event.log_tail,
            "stop_reason": None,
        },
    )


def _shard_stopped(state: ClusterState, event: ShardStopped, recorded: Recorded) -> None:
    changes: ShardChanges = {
        "phase": ShardPhase.STOPPED,
        "exit_code": event.exit_code,
        "stop_reason": event.reason,
    }
    if event.log_tail:  # an empty one keeps the tail an earlier failure reported
        changes["log_tail"] = event.log_tail
    replica_changes = (
        _stopped_by_agent(state, event.replica_id, recorded.recorded_at)
        if event.reason is not None
        else {}
    )
    _update_shard(state, event.replica_id, event.shard_index, changes, replica_changes)


def _stopped_by_agent(state: ClusterState, replica_id: str, at: datetime) -> ReplicaChanges:
    """A replica starting or serving whose agent stops a shard on purpose goes back to
    placed: out of routing, its placement kept, to be started there again."""
    replica = state.replicas.get(replica_id)
    if replica is None or replica.phase not in (ReplicaPhase.STARTING, ReplicaPhase.SERVING):
        return {}
    return {
        "phase": ReplicaPhase.PLACED,
        "routable": False,
        "starting_since": None,
        "serving_since": None,
        "agent_stopped_at": at,
    }


def _replica_placed(state: ClusterState, event: ReplicaPlaced, recorded: Recorded) -> None:
    at = recorded.recorded_at
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
        revision=event.revision,
    )
    model = state.models.get(event.model)
    if model is not None:
        moves = model.moves
        move = moves.get(event.replaces) if event.replaces is not None else None
        if move is not None:
            moves = {**moves, move.replica_id: replace(move, replacement_id=event.replica_id)}
        state.models[event.model] = replace(
            model,
            replicas_created=max(model.replicas_created, event.number),
            unplaceable_reason=None,
            moves=moves,
        )


def _replica_serving(state: ClusterState, event: ReplicaServing, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _update_replica(
        state,
        event.replica_id,
        {
            "phase": ReplicaPhase.SERVING,
            "serving_since": at,
            "routable": True,
            "agent_stopped_at": None,
        },
    )
    _model_of(state, event.replica_id, {"failures": 0, "backoff_until": None})


def _replica_drain_started(
    state: ClusterState, event: ReplicaDrainStarted, recorded: Recorded
) -> None:
    at = recorded.recorded_at
    replica = state.replicas.get(event.replica_id)
    if replica is None:
        return
    state.replicas[event.replica_id] = replace(
        replica, phase=ReplicaPhase.DRAINING, drain_id=event.drain_id, drain_started_at=at
    )
    move = Move(
        replica_id=event.replica_id, move_id=event.drain_id, started_at=at, reason=event.reason
    )
    model = state.models.get(replica.model)
    if model is not None:
        moves = {**model.moves, event.replica_id: move}
        state.models[replica.model] = replace(model, moves=moves)


def _replica_drain_cancelled(
    state: ClusterState, event: ReplicaDrainCancelled, recorded: Recorded
) -> None:
    replica = state.replicas.get(event.replica_id)
    if replica is not None and replica.phase is ReplicaPhase.DRAINING:
        state.replicas[event.replica_id] = replace(
            replica, phase=ReplicaPhase.SERVING, drain_id=None, drain_started_at=None
        )
        _move_over(state, replica)


def _replacement_serving(
    state: ClusterState, event: ReplacementServing, recorded: Recorded
) -> None:
    _update_replica(state, event.replica_id, {"replacement_id": event.replacement_id})


def _replica_stopping(state: ClusterState, event: ReplicaStopping, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _update_replica(
        state,
        event.replica_id,
        {
            "phase": ReplicaPhase.STOPPING,
            "routable": False,
            "stopping_since": at,
            "end_reason": event.reason,
            "surplus": event.surplus,
        },
    )
    replica = state.replicas.get(event.replica_id)
    if replica is not None:
        _move_over(state, replica)


def _replica_stopped(state: ClusterState, event: ReplicaStopped, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _end_replica(state, event.replica_id, ReplicaPhase.STOPPED, at, None)


def _replica_failed(state: ClusterState, event: ReplicaFailed, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _end_replica(state, event.replica_id, ReplicaPhase.FAILED, at, event.reason)
    _count_failure(state, event.replica_id, at)


def _replica_startup_timed_out(
    state: ClusterState, event: ReplicaStartupTimedOut, recorded: Recorded
) -> None:
    at = recorded.recorded_at
    reason = f"not ready after {event.waited_s:.0f}s (timeout {event.timeout_s:.0f}s)"
    _end_replica(state, event.replica_id, ReplicaPhase.TIMED_OUT, at, reason)
    _count_failure(state, event.replica_id, at)


def _replica_lost(state: ClusterState, event: ReplicaLost, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _end_replica(state, event.replica_id, ReplicaPhase.LOST, at, event.reason)
    replica = state.replicas.get(event.replica_id)
    if replica is not None:
        shards = tuple(
            replace(shard, phase=ShardPhase.LOST) if shard.phase in _VOUCHED_FOR else shard
            for shard in replica.shards
        )
        state.replicas[event.replica_id] = replace(replica, shards=shards)


_VOUCHED_FOR = frozenset({ShardPhase.PLACED, ShardPhase.STARTING, ShardPhase.READY})
"""Shard phases that say what an agent would run; a lost replica's shards lose them."""


def _replica_adopted(state: ClusterState, event: ReplicaAdopted, recorded: Recorded) -> None:
    at = recorded.recorded_at
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
            # An engine that came up and is adopted while its agent re-checks it is still
            # the engine that came up.
            "came_up": event.ready or _came_up_there(state, event),
            "epoch": recorded.meta.epoch,
            "stop_reason": None,
        },
        replica_changes=_starting(state, event.replica_id, at),
    )


def _came_up_there(state: ClusterState, event: ReplicaAdopted) -> bool:
    replica = state.replicas.get(event.replica_id)
    if replica is None or not 0 <= event.shard_index < len(replica.shards):
        return False
    shard = replica.shards[event.shard_index]
    return shard.came_up and (shard.node_id, shard.port) == (event.node_id, event.port)


def _node_registered(state: ClusterState, event: NodeRegistered, recorded: Recorded) -> None:
    at = recorded.recorded_at
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


def _node_connected(state: ClusterState, event: NodeConnected, recorded: Recorded) -> None:
    at = recorded.recorded_at
    node = state.nodes.get(event.node_id) or Node(
        id=event.node_id, address=event.address, registered_at=at
    )
    state.nodes[event.node_id] = replace(
        node,
        address=event.address,
        remote_address=event.remote_address,
        labels=event.labels,
        gpus=event.gpus,
        unlisted_gpus=_unlisted_gpus(node, event.gpus),
        agent_version=event.agent_version,
        port_range=event.port_range,
        certificate_serial=event.certificate_serial,
        connected=True,
        lost=False,
        last_change_at=at,
    )


UNLISTED_GPUS_KEPT = 64
"""Most GPUs left out of hellos a node keeps (``Node.unlisted_gpus``), the latest left
out: as many as a hello may list, so an agent listing other indexes at each hello cannot
grow the state."""


def _unlisted_gpus(node: Node, listed: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    """The node's unhealthy GPUs that a hello listing ``listed`` leaves out, after those
    that earlier hellos left out and this one does not list either (oldest first)."""
    indexes = {gpu.index for gpu in listed}
    unlisted = {gpu.index: gpu for gpu in node.unlisted_gpus if gpu.index not in indexes}
    for gpu in node.gpus:
        if not gpu.healthy and gpu.index not in indexes:
            unlisted.pop(gpu.index, None)
            unlisted[gpu.index] = gpu
    return tuple(unlisted.values())[-UNLISTED_GPUS_KEPT:]


def _node_disconnected(state: ClusterState, event: NodeDisconnected, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _update_node(state, event.node_id, {"connected": False, "last_change_at": at})


def _node_lost(state: ClusterState, event: NodeLost, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _update_node(state, event.node_id, {"connected": False, "lost": True, "last_change_at": at})


def _node_cordoned(state: ClusterState, event: NodeCordoned, recorded: Recorded) -> None:
    _update_node(state, event.node_id, {"cordoned": True, "cordon_reason": event.reason})


def _node_uncordoned(state: ClusterState, event: NodeUncordoned, recorded: Recorded) -> None:
    _update_node(
        state,
        event.node_id,
        {
            "cordoned": False,
            "cordon_reason": None,
            "drain_id": None,
            "drain_grace_s": None,
            "drain_requested_at": None,
            "drain_began_with": (),
        },
    )


def _node_drain_requested(
    state: ClusterState, event: NodeDrainRequested, recorded: Recorded
) -> None:
    at = recorded.recorded_at
    serving = (ReplicaPhase.SERVING, ReplicaPhase.DRAINING)
    began_with = sorted(
        r.id for r in state.replicas.values() if r.phase in serving and event.node_id in r.node_ids
    )
    _update_node(
        state,
        event.node_id,
        {
            "cordoned": True,
            "cordon_reason": f"drain {event.drain_id}",
            "drain_id": event.drain_id,
            "drain_grace_s": event.grace_s,
            "drain_requested_at": at,
            "drain_began_with": tuple(began_with),
        },
    )


def _node_drain_finished(state: ClusterState, event: NodeDrainFinished, recorded: Recorded) -> None:
    _update_node(
        state,
        event.node_id,
        {
            "drain_id": None,
            "drain_grace_s": None,
            "drain_requested_at": None,
            "drain_began_with": (),
        },
    )


def _gpu_marked_unhealthy(
    state: ClusterState, event: GpuMarkedUnhealthy, recorded: Recorded
) -> None:
    _update_gpu(
        state, event.node_id, event.gpu_index, {"healthy": False, "unhealthy_reason": event.reason}
    )


STRAY_NUMBERS_BELIEVED = 1000
"""How far past a model's replica count a stray's number is taken as used (see
``_count_stray_number``)."""


def _gpu_recovered(state: ClusterState, event: GpuRecovered, recorded: Recorded) -> None:
    _update_gpu(state, event.node_id, event.gpu_index, {"healthy": True, "unhealthy_reason": None})


def _stray_stopped(state: ClusterState, event: StrayStopped, recorded: Recorded) -> None:
    _remember_stray(state, event)
    _count_stray_number(state, event)


def _identity_rejected(state: ClusterState, event: IdentityRejected, recorded: Recorded) -> None:
    """Recorded for the audit trail; a refused connection is not state."""


def _model_declared(state: ClusterState, event: ModelDeclared, recorded: Recorded) -> None:
    at = recorded.recorded_at
    known = state.models.get(event.model)
    if known is None or known.removed:
        state.models[event.model] = Model(
            name=event.model,
            spec=event.spec,
            declared_at=at,
            replicas_created=known.replicas_created if known else 0,
            ended=known.ended if known else (),
            forgotten=known.forgotten if known else {},
            revision=event.revision,
            earlier_specs=_earlier_specs(state, known, event.revision) if known else {},
            latest_revision=max(event.revision, known.latest_revision if known else 0),
            rollout=known.rollout if known else None,
        )
    else:
        state.models[event.model] = replace(
            known,
            spec=event.spec,
            revision=event.revision,
            earlier_specs=_earlier_specs(state, known, event.revision),
            latest_revision=max(event.revision, known.latest_revision),
        )


def _earlier_specs(state: ClusterState, known: Model, revision: int) -> dict[int, ModelSpec]:
    """The specs of revisions before ``revision`` that active replicas of ``known`` run,
    the one it replaces included, and the one a rollout under way comes from. One scan of
    the replicas per declaration (rare), never one per replica event."""
    rollout = known.rollout
    placing_from = (
        rollout is not None and rollout.state in _PLACING_FROM and revision == known.revision
    )
    if revision == known.revision and not known.earlier_specs and not placing_from:
        return {}
    specs = {**known.earlier_specs, known.revision: known.spec}
    in_use = {
        r.revision
        for r in state.replicas.values()
        if r.model == known.name and r.phase in ACTIVE_PHASES and r.revision != revision
    }
    if revision != known.revision:
        # The spec it replaces, for the rollout that follows (``RolloutStarted`` takes it).
        in_use.add(known.revision)
    elif rollout is not None and placing_from:
        # It places replicas beyond its step at the revision it comes from
        # (``app.domain.rollout.new_revision_room``), even when none of them runs now.
        specs.setdefault(rollout.from_revision, rollout.from_spec)
        in_use.add(rollout.from_revision)
    return {n: spec for n, spec in specs.items() if n in in_use and n != revision}


_PLACING_FROM = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})


def _model_scaled(state: ClusterState, event: ModelScaled, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    if model is not None:
        spec = replace(model.spec, replicas=event.replicas)
        state.models[event.model] = replace(model, spec=spec)


def _model_removed(state: ClusterState, event: ModelRemoved, recorded: Recorded) -> None:
    _update_model(state, event.model, {"removed": True})


def _model_tuned(state: ClusterState, event: ModelTuned, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _tune(state, event, at)


def _model_unplaceable(state: ClusterState, event: ModelUnplaceable, recorded: Recorded) -> None:
    _update_model(state, event.model, {"unplaceable_reason": event.reason})


def _rollout_started(state: ClusterState, event: RolloutStarted, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    if model is None:
        return
    # A rollout still under way is superseded: the log says so (this event), and the model
    # keeps only the one it is now in.
    rollout = Rollout(
        id=event.rollout_id,
        revision=event.revision,
        from_revision=event.from_revision,
        from_spec=model.earlier_specs.get(event.from_revision, model.spec),
        started_at=recorded.recorded_at,
        undoes=event.undoes,
    )
    state.models[event.model] = replace(model, rollout=rollout)


def _rollout_step_started(
    state: ClusterState, event: RolloutStepStarted, recorded: Recorded
) -> None:
    _update_rollout(
        state,
        event.model,
        event.rollout_id,
        {
            "step": event.step,
            "step_started_at": recorded.recorded_at,
            "holding_since": None,
            "hold_ejections": {},
            "promoted": False,
            "paused_by_verdict": False,
        },
    )


def _rollout_holding(state: ClusterState, event: RolloutHolding, recorded: Recorded) -> None:
    _update_rollout(
        state,
        event.model,
        event.rollout_id,
        {"holding_since": recorded.recorded_at, "hold_ejections": {}},
    )


def _rollout_hold_ejection_seen(
    state: ClusterState, event: RolloutHoldEjectionSeen, recorded: Recorded
) -> None:
    model = state.models.get(event.model)
    rollout = model.rollout if model else None
    replica = state.replicas.get(event.replica_id)
    # Only for the hold it was seen in, and a replica of the model: the ejections kept are
    # as many as the model's replicas, whatever the event says.
    if (
        rollout is None
        or rollout.id != event.rollout_id
        or rollout.step != event.step
        or rollout.holding_since is None
        or replica is None
        or replica.model != event.model
        or event.gateways <= rollout.hold_ejections.get(event.replica_id, 0)
    ):
        return
    ejections = {**rollout.hold_ejections, event.replica_id: event.gateways}
    _update_rollout(state, event.model, event.rollout_id, {"hold_ejections": ejections})


def _rollout_verdict(state: ClusterState, event: RolloutVerdict, recorded: Recorded) -> None:
    _update_rollout(
        state,
        event.model,
        event.rollout_id,
        {
            "promoted": event.verdict == "promote",
            "paused_by_verdict": event.verdict == "inconclusive",
            "verdict": f"{event.verdict}: {event.reason}",
        },
    )


def _rollout_paused(state: ClusterState, event: RolloutPaused, recorded: Recorded) -> None:
    _update_rollout(
        state,
        event.model,
        event.rollout_id,
        {"state": RolloutState.PAUSED, "pause_reason": event.reason},
    )


def _rollout_resumed(state: ClusterState, event: RolloutResumed, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    rollout = model.rollout if model else None
    if rollout is None or rollout.id != event.rollout_id:
        return
    # Only a step whose verdict could not be reached is promoted by the operator's word. A
    # step the operator paused is judged on the next pass as usual: at once, on the
    # gateways' figures, if its hold ran out during the pause.
    _update_rollout(
        state,
        event.model,
        event.rollout_id,
        {
            "state": RolloutState.RUNNING,
            "pause_reason": None,
            "promoted": rollout.promoted or rollout.paused_by_verdict,
        },
    )


def _rollout_rolled_back(state: ClusterState, event: RolloutRolledBack, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    rollout = model.rollout if model else None
    if model is None or rollout is None or rollout.id != event.rollout_id:
        return
    rolled_back = replace(
        rollout, state=RolloutState.ROLLING_BACK, outcome=event.reason, pause_reason=None
    )
    state.models[event.model] = replace(
        model,
        spec=event.spec,
        revision=event.to_revision,
        earlier_specs=_earlier_specs(state, model, event.to_revision),
        failures=0,
        backoff_until=None,
        rollout=rolled_back,
    )


def _rollout_finished(state: ClusterState, event: RolloutFinished, recorded: Recorded) -> None:
    model = state.models.get(event.model)
    rollout = model.rollout if model else None
    if rollout is None or rollout.id != event.rollout_id:
        return
    if event.succeeded:
        ended = RolloutState.SUCCEEDED
    elif rollout.state is RolloutState.ROLLING_BACK:
        ended = RolloutState.ROLLED_BACK
    else:
        ended = RolloutState.ENDED
    _update_rollout(
        state,
        event.model,
        event.rollout_id,
        {"state": ended, "finished_at": recorded.recorded_at, "outcome": event.outcome},
    )


def _api_key_created(state: ClusterState, event: ApiKeyCreated, recorded: Recorded) -> None:
    at = recorded.recorded_at
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
        expires_at=event.expires_at,
    )


def _api_key_revoked(state: ClusterState, event: ApiKeyRevoked, recorded: Recorded) -> None:
    at = recorded.recorded_at
    key = state.keys.get(event.key_id)
    if key is not None and key.revoked_at is None:
        state.keys[event.key_id] = replace(key, revoked_at=at, revoked_by=recorded.meta.actor)


def _node_refused(state: ClusterState, event: NodeRefused, recorded: Recorded) -> None:
    """An audit record only: the refused connection changed nothing."""


def _certificate_revoked(
    state: ClusterState, event: CertificateRevoked, recorded: Recorded
) -> None:
    revocation = CertificateRevocation(
        serial=event.serial,
        node_id=event.node_id,
        reason=event.reason,
        revoked_at=recorded.recorded_at,
        revoked_by=recorded.meta.actor,
    )
    state.revocations[revocation.key] = revocation


# A table rather than a ``match``: a replay folds a million events, and a match tries its
# cases in order (some 0.2 us each); the table is one lookup. That every event type has a
# handler is checked by tests/unit/test_fold.py instead of by assert_never.
_HANDLERS: dict[type[Event], Callable[[ClusterState, Any, Recorded], None]] = {
    ShardStarting: _shard_starting,
    ShardReady: _shard_ready,
    ShardFailed: _shard_failed,
    ShardStopped: _shard_stopped,
    ReplicaPlaced: _replica_placed,
    ReplicaServing: _replica_serving,
    ReplicaDrainStarted: _replica_drain_started,
    ReplicaDrainCancelled: _replica_drain_cancelled,
    ReplacementServing: _replacement_serving,
    ReplicaStopping: _replica_stopping,
    ReplicaStopped: _replica_stopped,
    ReplicaFailed: _replica_failed,
    ReplicaStartupTimedOut: _replica_startup_timed_out,
    ReplicaLost: _replica_lost,
    ReplicaAdopted: _replica_adopted,
    NodeRegistered: _node_registered,
    NodeConnected: _node_connected,
    NodeDisconnected: _node_disconnected,
    NodeLost: _node_lost,
    NodeCordoned: _node_cordoned,
    NodeUncordoned: _node_uncordoned,
    NodeDrainRequested: _node_drain_requested,
    NodeDrainFinished: _node_drain_finished,
    GpuMarkedUnhealthy: _gpu_marked_unhealthy,
    GpuRecovered: _gpu_recovered,
    StrayStopped: _stray_stopped,
    IdentityRejected: _identity_rejected,
    NodeRefused: _node_refused,
    CertificateRevoked: _certificate_revoked,
    ModelDeclared: _model_declared,
    ModelScaled: _model_scaled,
    ModelRemoved: _model_removed,
    ModelTuned: _model_tuned,
    ModelUnplaceable: _model_unplaceable,
    RolloutStarted: _rollout_started,
    RolloutStepStarted: _rollout_step_started,
    RolloutHolding: _rollout_holding,
    RolloutHoldEjectionSeen: _rollout_hold_ejection_seen,
    RolloutVerdict: _rollout_verdict,
    RolloutPaused: _rollout_paused,
    RolloutResumed: _rollout_resumed,
    RolloutRolledBack: _rollout_rolled_back,
    RolloutFinished: _rollout_finished,
    ApiKeyCreated: _api_key_created,
    ApiKeyRevoked: _api_key_revoked,
}


def _starting(state: ClusterState, replica_id: str, at: datetime) -> ReplicaChanges:
    replica = state.replicas.get(replica_id)
    if replica is None or replica.phase is not ReplicaPhase.PLACED:
        return {}
    return {"phase": ReplicaPhase.STARTING, "starting_since": at}


def _update_shard(
    state: ClusterState,
    replica_id: str,
    index: int,
    changes: ShardChanges,
    replica_changes: ReplicaChanges | None = None,
) -> None:
    replica = state.replicas.get(replica_id)
    if replica is None or not 0 <= index < len(replica.shards):
        return
    shards = list(replica.shards)
    shards[index] = replace(shards[index], **changes)
    state.replicas[replica_id] = replace(replica, shards=tuple(shards), **(replica_changes or {}))


def _update_replica(state: ClusterState, replica_id: str, changes: ReplicaChanges) -> None:
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
    _move_over(state, replica)
    _keep_ended(state, replica)


def _move_over(state: ClusterState, replica: Replica) -> None:
    """``replica`` left routing or ended: a move of it is over, and a move it was placed
    for has no replacement any more (unless another one was placed since)."""
    model = state.models.get(replica.model)
    if model is None or not model.moves:
        return
    moves = model.moves
    if replica.id in moves:
        moves = {k: m for k, m in moves.items() if k != replica.id}
    waiting = moves.get(replica.replaces) if replica.replaces is not None else None
    if waiting is not None and waiting.replacement_id == replica.id:
        moves = {**moves, waiting.replica_id: replace(waiting, replacement_id=None)}
    if moves is not model.moves:
        state.models[model.name] = replace(model, moves=moves)


def _keep_ended(state: ClusterState, replica: Replica) -> None:
    """Add ``replica`` to its model's ended replicas (last, even if it ended before), and
    forget the first of them once there are more than ``ENDED_KEPT_PER_MODEL``: one tuple of
    at most that many ids per end, never a scan of the replicas. A replica of a model the
    state does not know is kept (nothing orders its end)."""
    model = state.models.get(replica.model)
    if model is None:
        return
    ended = (*(i for i in model.ended if i != replica.id), replica.id)
    forgotten = model.forgotten
    while len(ended) > ENDED_KEPT_PER_MODEL:
        oldest = state.replicas.get(ended[0])
        ended = ended[1:]
        # Only if it is still an ended replica of this model: an event may have brought it
        # back (the fold does not refuse that), and then it ends again later.
        if oldest is not None and oldest.model == model.name and oldest.phase in ENDED_PHASES:
            del state.replicas[oldest.id]
            phase = oldest.phase.value
            forgotten = {**forgotten, phase: forgotten.get(phase, 0) + 1}
            if state.forgotten is not None:
                state.forgotten.append(oldest)
    state.models[model.name] = replace(model, ended=ended, forgotten=forgotten)


def _remember_stray(state: ClusterState, event: StrayStopped) -> None:
    node = state.nodes.get(event.node_id)
    if node is not None:
        key = f"{event.replica_id}/{event.shard_index}/{event.pid}"
        strays = (*node.stray_stops, key)[-STRAYS_REMEMBERED:]
        state.nodes[event.node_id] = replace(node, stray_stops=strays)


def _count_stray_number(state: ClusterState, event: StrayStopped) -> None:
    """An engine named ``<model>-<n>`` ran, so ``n`` is taken even if the log never placed
    it: its placement was lost in a failover to a standby that had not received it. No new
    replica may take that id. A number far past the model's count is not believed: a node
    can name any, and must not be able to push the count anywhere it likes."""
    model = state.models.get(event.model)
    prefix = f"{event.model}-"
    if model is None or not event.replica_id.startswith(prefix):
        return
    digits = event.replica_id[len(prefix) :]
    if not (digits.isascii() and digits.isdigit()):
        return
    number = int(digits)
    if model.replicas_created < number <= model.replicas_created + STRAY_NUMBERS_BELIEVED:
        state.models[event.model] = replace(model, replicas_created=number)


def _model_of(state: ClusterState, replica_id: str, changes: ModelChanges) -> None:
    replica = state.replicas.get(replica_id)
    if replica is not None:
        _update_model(state, replica.model, changes)


def _count_failure(state: ClusterState, replica_id: str, at: datetime) -> None:
    replica = state.replicas.get(replica_id)
    model = state.models.get(replica.model) if replica else None
    if replica is None or model is None:
        return
    failures = model.failures + 1
    until = at + timedelta(seconds=backoff_s(failures))
    rollout = model.rollout
    if (
        rollout is not None
        and rollout.state in (RolloutState.RUNNING, RolloutState.PAUSED)
        and replica.revision == rollout.revision
    ):
        # A replica of the step failing during its hold starts the hold over once its
        # replacement serves: the verdict reads the gateways' last window of the active
        # replicas, so judged at once it would read the replacement just up and none of
        # the errors of the replica that failed.
        rollout = replace(
            rollout,
            failures=rollout.failures + 1,
            last_failure=f"{replica.id}: {replica.end_reason or replica.phase.value}",
            holding_since=None,
            hold_ejections={},
        )
    state.models[model.name] = replace(
        model, failures=failures, backoff_until=until, rollout=rollout
    )


def _update_rollout(
    state: ClusterState, name: str, rollout_id: str, changes: RolloutChanges
) -> None:
    """Change the model's rollout if it is ``rollout_id`` (an event of an earlier one, now
    superseded, changes nothing)."""
    model = state.models.get(name)
    rollout = model.rollout if model else None
    if model is not None and rollout is not None and rollout.id == rollout_id:
        state.models[name] = replace(model, rollout=replace(rollout, **changes))


def _update_node(state: ClusterState, node_id: str, changes: NodeChanges) -> None:
    node = state.nodes.get(node_id)
    if node is not None:
        state.nodes[node_id] = replace(node, **changes)


def _update_gpu(state: ClusterState, node_id: str, index: int, changes: GpuChanges) -> None:
    node = state.nodes.get(node_id)
    if node is None:
        return
    gpus = tuple(replace(g, **changes) if g.index == index else g for g in node.gpus)
    state.nodes[node_id] = replace(node, gpus=gpus)


def _update_model(state: ClusterState, name: str, changes: ModelChanges) -> None:
    model = state.models.get(name)
    if model is not None:
        state.models[name] = replace(model, **changes)


def _tune(state: ClusterState, event: ModelTuned, at: datetime) -> None:
    routing = RoutingSettings(
        weight=event.weight, target_waiting=event.target_waiting, kv_ceiling=event.kv_ceiling
    )
    if event.replica_id is not None:
        _update_replica(state, event.replica_id, {"routing": routing})
        return
    model = state.models.get(event.model)
    if model is not None:
        # Bench measures the three above; the model's policy and its knobs stay as declared.
        routing = replace(
            model.spec.routing,
            weight=routing.weight,
            target_waiting=routing.target_waiting,
            kv_ceiling=routing.kv_ceiling,
        )
        spec = replace(model.spec, routing=routing)
        state.models[event.model] = replace(model, spec=spec, tuned_summary=dict(event.summary))
