"""How a rollout brings a model's replicas to a revision: moves (the drain's mechanism: a
serving replica is marked draining, a replacement of the model's current revision is
placed, and it stops once that has served for the stability window), at most
``max_surge`` at once, and the stops ``max_unavailable`` allows before a replacement
serves. What a rollout does to a replica is recorded on the replica's stream under the
rollout's id (``record_on_replica``)."""

from __future__ import annotations

from app.domain.decision import Draft
from app.domain.events import (
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaStopping,
    replica_stream,
)
from app.domain.state import (
    ACTIVE_PHASES,
    COUNTING_PHASES,
    NOT_SERVING_YET,
    ClusterState,
    Model,
    Replica,
    ReplicaPhase,
    Rollout,
)


def converge(draft: Draft, model: Model, rollout: Rollout, target: int, *, every: bool) -> bool:
    """Bring the model's replicas of its current revision towards ``target`` serving (all
    of them when ``every``), by moves of this rollout and the stops ``max_unavailable``
    allows. True once there: as many serve, no move of this rollout is under way, and
    (when ``every``) no replica of another revision is left but those stopping."""
    policy = model.spec.rollout
    revision = model.revision
    replicas = active_replicas(draft.state, model.name)
    current = [r for r in replicas if r.revision == revision and r.phase in COUNTING_PHASES]
    moving = [m for m in model.moves.values() if m.move_id == rollout.id]
    outdated = [r for r in replicas if r.revision != revision]
    serving_outdated = sorted(
        (r for r in outdated if r.phase is ReplicaPhase.SERVING), key=lambda r: r.number
    )
    if every:
        for replica in outdated:
            if replica.phase in NOT_SERVING_YET:
                stop_replica(
                    draft,
                    replica,
                    rollout,
                    f"rollout {rollout.id}: not serving yet, placed again at revision {revision}",
                )
    coming = len(current) + sum(1 for m in moving if m.replacement_id is None)
    need = target - coming
    moves = min(max(need, 0), max(policy.max_surge - len(moving), 0), len(serving_outdated))
    for replica in serving_outdated[:moves]:
        record_on_replica(
            draft,
            rollout,
            ReplicaDrainStarted(
                replica_id=replica.id, drain_id=rollout.id, reason=f"rollout to revision {revision}"
            ),
        )
    need -= moves
    if need > 0 and policy.max_unavailable > 0:
        unavailable = model.desired - _available(replicas)
        stops = min(need, max(policy.max_unavailable - unavailable, 0))
        for replica in serving_outdated[moves : moves + stops]:
            reason = (
                f"rollout {rollout.id}: max_unavailable {policy.max_unavailable} lets it stop "
                "before its replacement serves"
            )
            stop_replica(draft, replica, rollout, reason)
    serving_current = sum(1 for r in current if r.phase is ReplicaPhase.SERVING)
    left_behind = every and any(
        r.phase is not ReplicaPhase.STOPPING
        for r in active_replicas(draft.state, model.name)
        if r.revision != revision
    )
    return serving_current >= target and not moving and not left_behind


def _available(replicas: list[Replica]) -> int:
    """Replicas that serve, a move's original and its serving replacement counted once."""
    serving = [r for r in replicas if r.phase in (ReplicaPhase.SERVING, ReplicaPhase.DRAINING)]
    doubled = {r.replaces for r in serving if r.replaces is not None}
    return sum(1 for r in serving if not (r.phase is ReplicaPhase.DRAINING and r.id in doubled))


def active_replicas(state: ClusterState, model: str) -> list[Replica]:
    return [r for r in state.replicas.values() if r.model == model and r.phase in ACTIVE_PHASES]


def stop_replica(draft: Draft, replica: Replica, rollout: Rollout, reason: str) -> None:
    record_on_replica(draft, rollout, ReplicaStopping(replica_id=replica.id, reason=reason))


ReplicaStep = ReplicaDrainStarted | ReplicaDrainCancelled | ReplicaStopping
"""What a rollout does to one of its model's replicas: moves it, calls its move off, or
stops it."""


def record_on_replica(draft: Draft, rollout: Rollout, event: ReplicaStep) -> None:
    """What the rollout does to one replica, on the replica's stream under the rollout's id."""
    draft.emit(replica_stream(event.replica_id), event, correlation_id=rollout.id)
