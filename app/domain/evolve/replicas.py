"""The fold of a replica's life: placed, serving, drained, stopping, and ended (stopped,
failed, timed out, lost); a replica is moved by one drain at a time. A failure or a startup
timeout counts against the model's backoff (and its rollout's step), except the failure of
a replica that served steadily first (``STEADY_SERVING_S``), which is replaced at once; an
end closes the moves that wait on the replica, and forgets the model's oldest ended replica
once it keeps more than ``ENDED_KEPT_PER_MODEL``. An end nobody asked for leaves a place
the next placement below the desired count takes (``Model.unreplaced_ends``). An operator's
``ended_replicas_forgotten`` forgets every replica of the model that ended by its cutoff,
those the fold keeps and those it forgot already (``state.forgotten``), as
``llmgw_append`` deletes their rows (migration 0020).

A replica only moves on: an event that would take it back to a phase it has left changes
nothing. An ended replica stays ended as it first ended (a second end counts no second
failure), a stopping one is drained or served no more, a draining one serves no more, and
a replica id placed once is never placed again. The fold takes every log it is given, so
such an event, recorded late (decided on a state the log has since moved past), is passed
over rather than refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from msgspec.structs import replace

from app.domain.changes import ModelChanges
from app.domain.envelope import Recorded
from app.domain.events import (
    EndedReplicasForgotten,
    Event,
    ReplacementServing,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
)
from app.domain.evolve.updates import Handler, update_model, update_replica
from app.domain.state import (
    COUNTING_PHASES,
    ENDED_KEPT_PER_MODEL,
    ENDED_PHASES,
    STEADY_SERVING_S,
    UNASKED_ENDS,
    ClusterState,
    Model,
    Move,
    Replica,
    ReplicaPhase,
    RolloutState,
    Shard,
    ShardPhase,
    backoff_s,
    is_gpu_move,
)


def _replica_placed(state: ClusterState, event: ReplicaPlaced, recorded: Recorded) -> None:
    if event.replica_id in state.replicas:
        return  # placed before: a second placement would start its life over
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
        # A placement that is no move's replacement takes the place of the earliest replica
        # that ended unasked (``desired_count`` names that one in its reason).
        unreplaced = (
            model.unreplaced_ends if event.replaces is not None else model.unreplaced_ends[1:]
        )
        state.models[event.model] = replace(
            model,
            replicas_created=max(model.replicas_created, event.number),
            unplaceable_reason=None,
            moves=moves,
            unreplaced_ends=unreplaced,
        )


def _replica_serving(state: ClusterState, event: ReplicaServing, recorded: Recorded) -> None:
    """Only a replica placed, starting or serving serves: one draining, stopping or ended
    is past serving, and would be routed to again."""
    at = recorded.recorded_at
    replica = state.replicas.get(event.replica_id)
    if replica is None or replica.phase not in COUNTING_PHASES:
        return
    update_replica(
        state,
        event.replica_id,
        {
            "phase": ReplicaPhase.SERVING,
            "serving_since": at,
            "routable": True,
            "agent_stopped_at": None,
        },
    )
    # The count of failures in a row stays: an engine that crashes soon after it serves is
    # still failing, and its backoff must go on doubling. It is reset by a replica that
    # served steadily (``_count_failure``); serving lifts the wait, and shows the node
    # can run the model.
    _model_of(state, event.replica_id, {"failed_on": {}, "backoff_until": None})


def _replica_drain_started(
    state: ClusterState, event: ReplicaDrainStarted, recorded: Recorded
) -> None:
    """A replica already draining keeps the drain that moves it: a second one, recorded by
    a reconciler's pass decided before the first was (``overtaken`` refuses it now), would
    take the first's move, its progress and its grace away from it. A replica stopping or
    ended is past draining: a drain would bring it back, with a move waiting on it."""
    at = recorded.recorded_at
    replica = state.replicas.get(event.replica_id)
    if replica is None or replica.phase not in COUNTING_PHASES:
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
            replica,
            phase=ReplicaPhase.SERVING,
            drain_id=None,
            drain_started_at=None,
            gpu_move_called_off=replica.gpu_move_called_off or is_gpu_move(replica.drain_id),
        )
        _move_over(state, replica)


def _replacement_serving(
    state: ClusterState, event: ReplacementServing, recorded: Recorded
) -> None:
    update_replica(state, event.replica_id, {"replacement_id": event.replacement_id})


def _replica_stopping(state: ClusterState, event: ReplicaStopping, recorded: Recorded) -> None:
    """An ended replica stays ended."""
    at = recorded.recorded_at
    replica = state.replicas.get(event.replica_id)
    if replica is None or replica.phase in ENDED_PHASES:
        return
    update_replica(
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
    _move_over(state, replica)


def _replica_stopped(state: ClusterState, event: ReplicaStopped, recorded: Recorded) -> None:
    at = recorded.recorded_at
    _end_replica(state, event.replica_id, ReplicaPhase.STOPPED, at, None)


def _replica_failed(state: ClusterState, event: ReplicaFailed, recorded: Recorded) -> None:
    at = recorded.recorded_at
    if _end_replica(state, event.replica_id, ReplicaPhase.FAILED, at, event.reason):
        _count_failure(state, event.replica_id, at)


def _replica_startup_timed_out(
    state: ClusterState, event: ReplicaStartupTimedOut, recorded: Recorded
) -> None:
    at = recorded.recorded_at
    if _end_replica(state, event.replica_id, ReplicaPhase.TIMED_OUT, at, event.reason):
        _count_failure(state, event.replica_id, at)


def _replica_lost(state: ClusterState, event: ReplicaLost, recorded: Recorded) -> None:
    at = recorded.recorded_at
    if not _end_replica(state, event.replica_id, ReplicaPhase.LOST, at, event.reason):
        return
    replica = state.replicas.get(event.replica_id)
    if replica is not None:
        shards = tuple(
            replace(shard, phase=ShardPhase.LOST) if shard.phase in _VOUCHED_FOR else shard
            for shard in replica.shards
        )
        state.replicas[event.replica_id] = replace(replica, shards=shards)


_VOUCHED_FOR = frozenset({ShardPhase.PLACED, ShardPhase.STARTING, ShardPhase.READY})
"""Shard phases that say what an agent would run; a lost replica's shards lose them."""


def _end_replica(
    state: ClusterState,
    replica_id: str,
    phase: ReplicaPhase,
    at: datetime,
    reason: str | None,
) -> bool:
    """End the replica in ``phase``; False, changing nothing, when it is unknown or has
    ended already."""
    replica = state.replicas.get(replica_id)
    if replica is None or replica.phase in ENDED_PHASES:
        return False
    state.replicas[replica_id] = replace(
        replica,
        phase=phase,
        routable=False,
        ended_at=at,
        end_reason=reason if reason is not None else replica.end_reason,
    )
    _move_over(state, replica)
    # One that counted and ends unasked leaves a place a placement takes (a draining or
    # stopping one left none).
    if phase in UNASKED_ENDS and replica.phase in COUNTING_PHASES:
        _await_replacement(state, replica)
    _keep_ended(state, replica)
    return True


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


def _await_replacement(state: ClusterState, replica: Replica) -> None:
    """Keep ``replica``'s place for the next placement below the desired count; unless it
    was a move's replacement and the move goes on: its next replacement takes the place."""
    model = state.models.get(replica.model)
    if model is None or replica.id in model.unreplaced_ends:
        return
    if replica.replaces is not None and replica.replaces in model.moves:
        return
    unreplaced = (*model.unreplaced_ends, replica.id)
    state.models[model.name] = replace(model, unreplaced_ends=unreplaced)


def _keep_ended(state: ClusterState, replica: Replica) -> None:
    """Add ``replica`` to its model's ended replicas (last), and forget the first of them
    once there are more than ``ENDED_KEPT_PER_MODEL``: one tuple of at most that many ids
    per end, never a scan of the replicas. A replica of a model the
    state does not know is kept (nothing orders its end)."""
    model = state.models.get(replica.model)
    if model is None:
        return
    ended = (*(i for i in model.ended if i != replica.id), replica.id)
    forgotten = model.forgotten
    unreplaced = model.unreplaced_ends
    while len(ended) > ENDED_KEPT_PER_MODEL:
        oldest = state.replicas.get(ended[0])
        ended = ended[1:]
        # An ended replica stays ended, so this holds; checked all the same, since
        # forgetting a replica that is not ended would lose a live one.
        if oldest is not None and oldest.model == model.name and oldest.phase in ENDED_PHASES:
            del state.replicas[oldest.id]
            unreplaced = tuple(i for i in unreplaced if i != oldest.id)
            phase = oldest.phase.value
            forgotten = {**forgotten, phase: forgotten.get(phase, 0) + 1}
            if state.forgotten is not None:
                state.forgotten.append(oldest)
    state.models[model.name] = replace(
        model, ended=ended, forgotten=forgotten, unreplaced_ends=unreplaced
    )


def _ended_replicas_forgotten(
    state: ClusterState, event: EndedReplicasForgotten, recorded: Recorded
) -> None:
    """Forget the model's replicas that ended at or before the cutoff: those the fold keeps
    leave it as ``_keep_ended`` forgets one (counted by phase in ``Model.forgotten``, their
    numbers still taken), and those it forgot already leave ``state.forgotten``, so that no
    row of any of them is kept. Every replica is looked at, not the model's ``ended``: one
    of a model the state did not know when it ended is kept outside it. A walk of the
    replicas the fold holds, for an operator's request, never for an end."""
    before = event.before if event.before.tzinfo is not None else event.before.replace(tzinfo=UTC)
    gone = [r for r in state.replicas.values() if _ended_by(r, event.model, before)]
    if state.forgotten is not None:
        # An id's row holds the replica the fold holds, else the one it forgot last (as
        # ``all_rows`` writes it); where that row goes, every replica of the id the fold
        # forgot goes with it, as ``llmgw_append`` deletes the row. In place: whoever set
        # the list reads it (a rebuild keeps the rows it holds).
        rows = {r.id: r for r in state.forgotten}
        rows.update(state.replicas)
        ended = {i for i, r in rows.items() if _ended_by(r, event.model, before)}
        state.forgotten[:] = [r for r in state.forgotten if r.id not in ended]
    for replica in gone:
        del state.replicas[replica.id]
    model = state.models.get(event.model)
    if model is None or not gone:
        return
    ids = {r.id for r in gone}
    forgotten = dict(model.forgotten)
    for replica in gone:
        forgotten[replica.phase.value] = forgotten.get(replica.phase.value, 0) + 1
    state.models[model.name] = replace(
        model,
        ended=tuple(i for i in model.ended if i not in ids),
        unreplaced_ends=tuple(i for i in model.unreplaced_ends if i not in ids),
        forgotten=forgotten,
    )


def _ended_by(replica: Replica, model: str, before: datetime) -> bool:
    """Whether ``replica`` is one of ``model``'s that ended at or before ``before``."""
    ended_at = replica.ended_at
    return (
        replica.model == model
        and replica.phase in ENDED_PHASES
        and ended_at is not None
        and ended_at <= before
    )


def _model_of(state: ClusterState, replica_id: str, changes: ModelChanges) -> None:
    replica = state.replicas.get(replica_id)
    if replica is not None:
        update_model(state, replica.model, changes)


def _served_steadily(replica: Replica, at: datetime) -> bool:
    """Whether the replica had served for ``STEADY_SERVING_S`` by ``at``: its end then is no
    failed start, and the model's failures before it are forgiven."""
    served = replica.serving_since
    return served is not None and at - served >= timedelta(seconds=STEADY_SERVING_S)


def _count_failure(state: ClusterState, replica_id: str, at: datetime) -> None:
    replica = state.replicas.get(replica_id)
    model = state.models.get(replica.model) if replica else None
    if replica is None or model is None:
        return
    failures, until, failed_on = model.failures, model.backoff_until, model.failed_on
    last_failed_at = model.last_failed_at
    steady = _served_steadily(replica, at)
    if steady or _streak_ended(state, model, at):
        failures, until, failed_on = 0, None, {}
    if not steady:
        failures += 1
        last_failed_at = at
        until = at + timedelta(seconds=backoff_s(failures))
        failed_on = dict(failed_on)
        for node_id in {shard.node_id for shard in replica.shards}:
            failed_on[node_id] = failed_on.get(node_id, 0) + 1
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
        model,
        failures=failures,
        failed_on=failed_on,
        backoff_until=until,
        last_failed_at=last_failed_at,
        rollout=rollout,
    )


def _streak_ended(state: ClusterState, model: Model, at: datetime) -> bool:
    """Whether a replica of ``model`` that began serving after its last counted failure has
    served steadily by ``at``: the failures before were a streak it ended. One serving
    since before them ends none (a replica added beside it failing to start, again and
    again, still backs off longer each time). One walk over the replicas, only while a
    streak is counted."""
    since = model.last_failed_at
    if model.failures == 0 or since is None:
        return False
    return any(
        other.model == model.name
        and other.phase is ReplicaPhase.SERVING
        and other.serving_since is not None
        and other.serving_since >= since
        and _served_steadily(other, at)
        for other in state.replicas.values()
    )


HANDLERS: dict[type[Event], Handler] = {
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
    EndedReplicasForgotten: _ended_replicas_forgotten,
}
"""The events this module folds, each with its handler."""
