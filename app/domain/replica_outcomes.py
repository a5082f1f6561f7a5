"""Rules 2-6 of ``reconcile.decide``: what became of nodes and replicas, from what agents
report and how long they have waited. Nodes away past the lost timeout are lost with their
replicas; shards no agent reports any more are lost; replicas starting past their model's
startup timeout are timed out; a failed shard fails its replica and all shards ready make
it serve; a replica of several shards whose agent stopped one while another ran on is
replaced whole once that node is back; a stopping replica whose shards are gone (none that
its node reports running) is stopped."""

from __future__ import annotations

from datetime import datetime, timedelta

from app.domain.commands import start_command_id
from app.domain.decision import Draft
from app.domain.desired_count import stop_replica
from app.domain.events import (
    NodeDisconnected,
    NodeLost,
    ReplicaFailed,
    ReplicaLost,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import DEFAULT_STARTUP_TIMEOUT_S
from app.domain.reconcile_settings import Settings
from app.domain.reports import FleetView
from app.domain.state import (
    ACTIVE_PHASES,
    COUNTING_PHASES,
    NOT_SERVING_YET,
    ClusterState,
    Replica,
    ReplicaPhase,
    Shard,
    ShardPhase,
)


def nodes_gone(draft: Draft, fleet: FleetView, settings: Settings) -> None:
    state, now = draft.state, draft.now
    lost_after = timedelta(seconds=settings.lost_timeout_s)
    for node in list(state.nodes.values()):
        if node.lost:
            continue
        if node.connected and node.id not in fleet.reports:
            draft.emit(
                node_stream(node.id),
                NodeDisconnected(node_id=node.id, reason=_why_not_connected(fleet, node.id)),
            )
            node = state.nodes[node.id]
        if node.connected:
            continue
        since = node.last_change_at or node.registered_at
        if now - since <= lost_after:
            continue
        away = (now - since).total_seconds()
        draft.emit(node_stream(node.id), NodeLost(node_id=node.id, disconnected_for_s=away))
        for replica in _replicas_on(state, node.id):
            if replica.phase is ReplicaPhase.STOPPING:
                draft.emit(replica_stream(replica.id), ReplicaStopped(replica_id=replica.id))
            else:
                reason = f"node {node.id} lost after {away:.0f}s without its agent"
                draft.emit(
                    replica_stream(replica.id), ReplicaLost(replica_id=replica.id, reason=reason)
                )


def _why_not_connected(fleet: FleetView, node_id: str) -> str:
    """Why a node the log says is connected is not, by what this control plane saw: its
    connection here ended, and the disconnect could not be recorded then (the database
    away); or it never said hello here, and the connection belonged to a predecessor."""
    why = fleet.disconnected.get(node_id)
    if why is None:
        return "did not reconnect after the control plane started"
    return (
        f"disconnected ({why}) and not back since; recorded late, as the disconnect could "
        "not be recorded when it happened"
    )


def missing_shards(draft: Draft, fleet: FleetView) -> None:
    """Lose each active replica with a shard the log has starting or ready on a node that
    said hello, when that node no longer lists the shard, or lists it ``failed``: an agent
    lists the failures it could not report (its engine exited while the agent was away, or
    while no connection heard it) in its next hello and in every heartbeat after, until
    the shard is stopped, and runs one engine per shard, so nothing of that shard runs
    there. Without this the log kept such a replica serving for ever. A shard listed
    ``stopped`` is left to the node's next report (a stray's stop, at another port). Why
    the agent says a shard failed (``ReportedShard.failure``) goes in the reason, quoted as
    its word: only shown, never decided on."""
    for replica in list(draft.state.replicas.values()):
        if replica.phase not in ACTIVE_PHASES or replica.phase is ReplicaPhase.STOPPING:
            continue
        for shard in replica.shards:
            report = fleet.reports.get(shard.node_id)
            if report is None or shard.phase not in (ShardPhase.STARTING, ShardPhase.READY):
                continue
            listed = report.shards.get((replica.id, shard.index))
            if listed is None or listed.state == ShardPhase.FAILED.value:
                reason = f"shard {shard.index} no longer runs on {shard.node_id}"
                if listed is not None:
                    reason += ": its agent reports it failed"
                    if listed.failure:
                        reason += f" (the agent says: {listed.failure})"
                draft.emit(
                    replica_stream(replica.id), ReplicaLost(replica_id=replica.id, reason=reason)
                )
                break


def startup_timeouts(draft: Draft) -> None:
    state, now = draft.state, draft.now
    for replica in list(state.replicas.values()):
        if replica.phase not in NOT_SERVING_YET:
            continue
        since = _startup_clock(state, replica)
        if since is None:
            continue
        timeout = _startup_timeout_s(state, replica)
        waited = (now - since).total_seconds()
        if waited > timeout:
            draft.emit(
                replica_stream(replica.id),
                ReplicaStartupTimedOut(replica_id=replica.id, timeout_s=timeout, waited_s=waited),
            )


def _startup_clock(state: ClusterState, replica: Replica) -> datetime | None:
    """Since when a placed or starting replica has been starting, for its timeout; None
    while it waits for a node whose agent stopped one of its shards on purpose (that node
    being away is the lost timeout's business). Such a replica starts again once every
    such node is back: its clock starts then, never earlier than the stop."""
    if replica.phase is ReplicaPhase.STARTING and replica.starting_since is not None:
        return replica.starting_since
    waiting_on = {s.node_id for s in replica.shards if s.stopped_by_agent}
    if not waiting_on:
        return replica.starting_since or replica.placed_at
    nodes = [state.nodes.get(node_id) for node_id in waiting_on]
    if any(node is None or not node.connected for node in nodes):
        return None
    back = [node.last_change_at for node in nodes if node is not None and node.last_change_at]
    return max([replica.agent_stopped_at or replica.placed_at, *back])


def shard_outcomes(draft: Draft, fleet: FleetView) -> None:
    for replica in list(draft.state.replicas.values()):
        if replica.phase not in COUNTING_PHASES | {ReplicaPhase.DRAINING}:
            continue
        if replica.phase is ReplicaPhase.DRAINING and (
            stopped := next((s for s in replica.shards if s.stopped_by_agent), None)
        ):
            # It would only serve again to be moved: its replacement is on its way.
            reason = f"shard {stopped.index} stopped by {stopped.node_id}: {stopped.stop_reason}"
            stop_replica(draft, replica, reason)
            continue
        if replica.phase is ReplicaPhase.PLACED and (
            cannot_rejoin := _peers_ran_on(replica, fleet)
        ):
            stop_replica(draft, replica, cannot_rejoin)
            continue
        failed = next(
            (
                s
                for s in replica.shards
                if s.phase is ShardPhase.FAILED
                or (s.phase is ShardPhase.STOPPED and not s.stopped_by_agent)
            ),
            None,
        )
        if failed is not None:
            what = (
                f"failed: {failed.error or 'exited'}"
                if failed.phase is ShardPhase.FAILED
                else "stopped without being asked to"
            )
            reason = f"shard {failed.index} on {failed.node_id} {what}"
            draft.emit(
                replica_stream(replica.id), ReplicaFailed(replica_id=replica.id, reason=reason)
            )
        elif replica.phase in NOT_SERVING_YET and all(
            s.phase is ShardPhase.READY for s in replica.shards
        ):
            draft.emit(replica_stream(replica.id), ReplicaServing(replica_id=replica.id))


def _peers_ran_on(replica: Replica, fleet: FleetView) -> str | None:
    """Why a replica of several shards is replaced whole rather than started again: one of
    its shards was stopped by its agent, whose node is back, while another kept running (its
    node reports its engine: the log's copy may predate a stop that never reached it).
    Multi-node engines form their group once, at start: a shard started again alone cannot
    rejoin peers that ran on, and would only hang until the startup timeout with every
    GPU of the replica held. None when nothing of it kept running (a whole cluster
    stopped and started again): the replica starts again under its own id."""
    stopped = next(
        (s for s in replica.shards if s.stopped_by_agent and s.node_id in fleet.reports), None
    )
    ran_on = next((s for s in replica.shards if _reported_running(replica, s, fleet)), None)
    if stopped is None or ran_on is None:
        return None
    return (
        f"shard {stopped.index} stopped by {stopped.node_id} ({stopped.stop_reason}) while "
        f"shard {ran_on.index} kept running on {ran_on.node_id}: a shard started again alone "
        "cannot rejoin its peers"
    )


def _reported_running(replica: Replica, shard: Shard, fleet: FleetView) -> bool:
    report = fleet.reports.get(shard.node_id)
    reported = report.shards.get((replica.id, shard.index)) if report else None
    return reported is not None and reported.running


def _startup_timeout_s(state: ClusterState, replica: Replica) -> float:
    model = state.models.get(replica.model)
    return model.spec.startup_timeout_s if model else DEFAULT_STARTUP_TIMEOUT_S


def stopping_done(draft: Draft, fleet: FleetView) -> None:
    for replica in list(draft.state.replicas.values()):
        if replica.phase is not ReplicaPhase.STOPPING:
            continue
        # An unanswered start counts as long as an engine may take to start: an agent
        # answers a start once it has launched the engine (or refused it), so one that has
        # not answered by then is wedged or hostile, and its silence must not keep the
        # replica stopping (and its node's drain open) until it disconnects.
        since = draft.now - timedelta(seconds=_startup_timeout_s(draft.state, replica))
        if all(_shard_gone(replica, s, fleet, since) for s in replica.shards):
            draft.emit(
                replica_stream(replica.id),
                ReplicaStopped(replica_id=replica.id),
                correlation_id=replica.drain_id,
            )


def _shard_gone(replica: Replica, shard: Shard, fleet: FleetView, awaited_since: datetime) -> bool:
    """Whether nothing of a stopping replica's shard runs: it stopped, failed or never
    started, or its node, which said hello to this control plane, no longer reports it.

    Never while its node reports an engine of it running, whatever the log has of the
    shard: an engine an earlier leader started may be unknown to the log (only ``placed``
    there: the leader died before recording the start), and the replica's GPUs must not be
    placed again while it still holds them. It is gone once its node reports it stopped,
    lists it ended (``failed``: an agent killed during the stop finds the engine gone when
    it starts again, and lists it so), or no longer lists it, or the node is lost
    (``nodes_gone``).

    Not while its node has not answered the start this control plane sent it at or after
    ``awaited_since``: an agent reports what a start did before answering it, so the engine
    may be coming up still unreported (a shard the log has only placed is not "never
    started" then, and a drain of its node would finish while it starts there). A start
    sent before that and still unanswered no longer counts (an engine the agent starts
    after all is a stray then, stopped as one). A node that has not said hello proves
    nothing: it may be on its way back with the engine still running (a lost node is
    handled with it)."""
    report = fleet.reports.get(shard.node_id)
    reported = report.shards.get((replica.id, shard.index)) if report else None
    if reported is not None and reported.running:
        return False
    sent_at = report.awaited.get(start_command_id(replica.id, shard.index)) if report else None
    if sent_at is not None and sent_at >= awaited_since:
        return False
    return shard.phase in (ShardPhase.STOPPED, ShardPhase.FAILED, ShardPhase.PLACED) or (
        report is not None and (reported is None or not reported.running)
    )


def _replicas_on(state: ClusterState, node_id: str) -> list[Replica]:
    return [
        r
        for r in state.replicas.values()
        if r.phase in ACTIVE_PHASES and any(s.node_id == node_id for s in r.shards)
    ]
