"""The fold: ``evolve(state, recorded) -> state``, the only place state changes.

The same function builds the control plane's view at start-up and the SQL projection
rows, so the two cannot disagree. It updates ``state``'s maps in place and returns it: a
replay folds a million events and cannot afford to copy four maps per event. Entities are
frozen and replaced, never mutated, so anyone holding one (or a ``state.copy()``) keeps a
consistent picture. Events about an entity the state does not know leave it unchanged.

The fold keeps the live cluster, not its whole history: once more than
``ENDED_KEPT_PER_MODEL`` replicas of a model have ended, the one that ended first is
forgotten (``replicas._keep_ended``), so the state, its snapshots and a start-up stay the
size of the cluster however long the log. Events about a forgotten replica leave the state
unchanged, like events about one it never knew.

The handlers live beside this module, one module per part of the state: ``shards``,
``replicas``, ``nodes`` (with their GPUs), ``models``, ``rollouts`` and ``credentials`` (API
keys and certificates), with ``updates``, how each replaces an entity it changes. ``_HANDLERS``
below is the one table of which handler folds which event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from app.domain.envelope import Recorded
from app.domain.events import (
    ApiKeyCreated,
    ApiKeyRevoked,
    CertificateRevoked,
    Event,
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
from app.domain.evolve.credentials import (
    _api_key_created,
    _api_key_revoked,
    _certificate_revoked,
    _identity_rejected,
    _node_refused,
)
from app.domain.evolve.models import (
    _model_declared,
    _model_removed,
    _model_scaled,
    _model_tuned,
    _model_unplaceable,
)
from app.domain.evolve.nodes import (
    _gpu_marked_unhealthy,
    _gpu_recovered,
    _node_connected,
    _node_cordoned,
    _node_disconnected,
    _node_drain_finished,
    _node_drain_requested,
    _node_lost,
    _node_registered,
    _node_uncordoned,
    _stray_stopped,
)
from app.domain.evolve.replicas import (
    _replacement_serving,
    _replica_drain_cancelled,
    _replica_drain_started,
    _replica_failed,
    _replica_lost,
    _replica_placed,
    _replica_serving,
    _replica_startup_timed_out,
    _replica_stopped,
    _replica_stopping,
)
from app.domain.evolve.rollouts import (
    _rollout_finished,
    _rollout_hold_ejection_seen,
    _rollout_holding,
    _rollout_paused,
    _rollout_resumed,
    _rollout_rolled_back,
    _rollout_started,
    _rollout_step_started,
    _rollout_verdict,
)
from app.domain.evolve.shards import (
    _replica_adopted,
    _shard_failed,
    _shard_ready,
    _shard_starting,
    _shard_stopped,
)
from app.domain.state import ClusterState


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
