"""The reconciler's decision: ``decide(state, fleet, now, settings) -> Decision``.

Pure: the clock, the leader epoch and what agents report are parameters; it returns events
to append and commands to send, and never reads time, logs or awaits. Each rule sees the
effects of the rules before it in the same pass (they are folded into a working copy), so
one pass never contradicts itself. The rules, in order:

1. adoption: what agents report running is matched against the log (see ``adoption``);
2. nodes that stayed away past the lost timeout are lost, with their replicas;
3. shards the log expects that no agent reports are lost;
4. replicas in ``starting`` past their model's startup timeout are timed out;
5. a failed shard fails its replica (so does one that stopped unasked, unless its agent
   stopped it on purpose: that replica waits to be started again where it was placed);
   all shards ready make a replica serve;
6. stopping replicas whose shards are gone are stopped;
7. drains move replicas (see ``drain``);
8. each model is brought to its desired count (placement, or stopping the newest);
9. commands: start placed shards (and shards their agents stopped on purpose), stop what
   should not run (a replica taken out of routing once gateways report nothing in flight
   on it, or after a timeout).

Rules 2-4 and the placements of rule 8 wait for the adoption grace after a start, so a
control plane never races its own agents; the grace follows the fleet (``adoption_grace``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import msgspec

from app.domain import autoscale
from app.domain.adoption import adopt_reported
from app.domain.adoption_grace import (
    DEFAULT_ADOPTION_GRACE_MAX_S,
    DEFAULT_ADOPTION_GRACE_S,
    DEFAULT_ADOPTION_QUIET_S,
    AdoptionGrace,
    GraceState,
    grace_state,
)
from app.domain.allocation import Allocations
from app.domain.commands import (
    StartShard,
    StopShard,
    start_command,
    start_command_id,
    stop_command,
)
from app.domain.decision import AUTOSCALER, Decision, Draft, PlannedEvent
from app.domain.drain import drain_moves
from app.domain.events import (
    ModelScaled,
    ModelUnplaceable,
    NodeDisconnected,
    NodeLost,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    model_stream,
    node_stream,
    replica_id_for,
    replica_stream,
)
from app.domain.model_spec import DEFAULT_STARTUP_TIMEOUT_S
from app.domain.placement import Placer
from app.domain.reports import FleetView
from app.domain.rollout import new_revision_room, rollout_moves
from app.domain.state import (
    ACTIVE_PHASES,
    ClusterState,
    Model,
    Replica,
    ReplicaPhase,
    Shard,
    ShardPhase,
)

COUNTING_PHASES = frozenset({ReplicaPhase.PLACED, ReplicaPhase.STARTING, ReplicaPhase.SERVING})
"""Replicas that count towards a model's desired count (draining ones do not)."""
STOPPED_BY_PLAN = frozenset({ReplicaPhase.STOPPED, ReplicaPhase.FAILED, ReplicaPhase.TIMED_OUT})
"""Ended replicas whose engines are stopped as planned (a lost one's are strays)."""


DEFAULT_LOST_TIMEOUT_S = 60.0
DEFAULT_STABILITY_WINDOW_S = 10.0
DEFAULT_DRAIN_IDLE_TIMEOUT_S = 60.0
"""The reconciler's timings, written once: ``llmgw-server serve``'s flags default to them."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    epoch: int
    started_at: datetime
    adoption_grace_s: float = DEFAULT_ADOPTION_GRACE_S
    """The least the adoption grace lasts, unless every node is back sooner."""
    adoption_quiet_s: float = DEFAULT_ADOPTION_QUIET_S
    """Past the least, the grace lasts until no agent arrived for this long."""
    adoption_grace_max_s: float = DEFAULT_ADOPTION_GRACE_MAX_S
    """The most the grace lasts, whatever the fleet does."""
    adoption_grace_ended: bool = False
    """The grace ended at an earlier pass: it never opens again in this term."""
    lost_timeout_s: float = DEFAULT_LOST_TIMEOUT_S
    stability_window_s: float = DEFAULT_STABILITY_WINDOW_S
    replica_drain_grace_s: float = 600.0
    stray_grace_s: float = 10.0
    quiesce_s: float = 2.0
    """How long a replica out of routing keeps running before its engines are told to stop,
    so gateways see it leave the routing table before it goes; less when every live gateway
    has said it routes by a table without it (``FleetView.routing_seen``)."""
    drain_idle_timeout_s: float = DEFAULT_DRAIN_IDLE_TIMEOUT_S
    """How long a replica out of routing waits for the requests gateways report in flight
    on it to finish; past this it is stopped anyway (its engines then get their stop
    grace), so a stuck request or a gateway that reports forever cannot keep it alive."""


def adoption_grace_state(
    state: ClusterState, fleet: FleetView, now: datetime, s: Settings
) -> GraceState:
    """Whether the adoption grace is open, and if not, why it ended (``adoption_grace``)."""
    return grace_state(
        AdoptionGrace(
            minimum_s=s.adoption_grace_s,
            quiet_s=s.adoption_quiet_s,
            maximum_s=s.adoption_grace_max_s,
        ),
        started_at=s.started_at,
        now=now,
        expected=[n.id for n in state.nodes.values() if not n.lost],
        said_hello=fleet.reports.keys(),
        arrivals=fleet.arrivals,
        ended=s.adoption_grace_ended,
    )


def in_adoption_grace(state: ClusterState, fleet: FleetView, now: datetime, s: Settings) -> bool:
    """True until every node the log knows has said hello, or agents stopped arriving (past
    the least grace), or the most grace passed."""
    return adoption_grace_state(state, fleet, now, s) is GraceState.OPEN


def decide(state: ClusterState, fleet: FleetView, now: datetime, settings: Settings) -> Decision:
    draft = Draft(state, now, settings.epoch)
    grace = in_adoption_grace(state, fleet, now, settings)
    adopt_reported(draft, fleet, settings.stray_grace_s)
    if not grace:
        _nodes_gone(draft, fleet, settings)
        _missing_shards(draft, fleet)
        _startup_timeouts(draft)
    _shard_outcomes(draft)
    _stopping_done(draft, fleet)
    if not grace:
        _autoscale(draft, fleet)
        rollout_moves(draft, fleet.traffic, fleet.ejected)
    drain_moves(draft, settings.stability_window_s, settings.replica_drain_grace_s)
    _scale(draft, placing=not grace)
    _commands(draft, fleet, settings)
    return draft.decision()


def overtaken(state: ClusterState, events: Sequence[PlannedEvent]) -> str | None:
    """The stream of an operator's change that ``events`` (a pass's decision, or a run of
    it) now contradict, judged on ``state``: the log with them folded in; None when they
    still hold.

    A pass appends after it decided, and an operator's change recorded between the two
    (through any control plane) was not in what it decided on. The model's own stream is
    checked by version (nothing but operators and the leader write it); node and replica
    streams are not, since agents write them all the time. So the run is checked against
    what an operator decides on a node or model: a replica placed on a node cordoned or
    draining (nothing decided places there), for a model removed, or beyond its model's
    count (a pass places up to the count, never past it), and a replica stopped as surplus
    that leaves its model short of its count (``_surplus_stop_overtaken``), say the run was
    decided before the change and would undo it."""
    placed = [p.event for p in events if isinstance(p.event, ReplicaPlaced)]
    for event in placed:
        model = state.models.get(event.model)
        if model is None or model.removed:
            return model_stream(event.model)
        for shard in event.shards:
            node = state.nodes.get(shard.node_id)
            if node is None or node.cordoned or node.drain_id is not None:
                return node_stream(shard.node_id)
    for name in sorted({event.model for event in placed}):
        if _counting(state, name) > state.models[name].desired:
            return model_stream(name)
    for planned in events:
        if isinstance(planned.event, ReplicaStopping) and planned.event.surplus:
            short = _surplus_stop_overtaken(state, planned.event.replica_id)
            if short is not None:
                return short
    return None


def _surplus_stop_overtaken(state: ClusterState, replica_id: str) -> str | None:
    """The model's stream when the replica, stopped as surplus (its stop folded into
    ``state``), leaves its model short of the count it has now: a scale-up recorded since
    the pass decided the stop. A pass stops a replica that counts only down to the count,
    and a moved one (draining, serving until its replacement does) only while the
    replicas that count and the moves still waiting for a replacement make the count
    without it; a stop that goes below would be followed at once by a new placement, a dip
    in the model's capacity the operator never asked for."""
    replica = state.replicas.get(replica_id)
    model = state.models.get(replica.model) if replica is not None else None
    if replica is None or model is None:
        return None
    serving = _counting(state, model.name)
    if replica.drain_id is not None:
        serving += len(waiting_for_replacement(state, model))
    return model_stream(model.name) if serving < model.desired else None


def _counting(state: ClusterState, model_name: str) -> int:
    return sum(
        1 for r in state.replicas.values() if r.model == model_name and r.phase in COUNTING_PHASES
    )


def _autoscale(draft: Draft, fleet: FleetView) -> None:
    for name in sorted(fleet.demand):
        model = draft.state.models.get(name)
        if model is None:
            continue
        decision = autoscale.decide(model, fleet.demand[name], draft.now)
        if decision is None or decision.replicas == model.spec.replicas:
            continue  # a count that holds records nothing
        draft.emit(
            model_stream(name),
            ModelScaled(
                model=name,
                replicas=decision.replicas,
                previous=model.spec.replicas,
                reason=decision.reason,
                inputs=decision.inputs,
            ),
            actor=AUTOSCALER,
        )


def _nodes_gone(draft: Draft, fleet: FleetView, settings: Settings) -> None:
    state, now = draft.state, draft.now
    lost_after = timedelta(seconds=settings.lost_timeout_s)
    for node in list(state.nodes.values()):
        if node.lost:
            continue
        if node.connected and node.id not in fleet.reports:
            # The log says connected, but this control plane has not heard from it since it
            # started: the connection belonged to a predecessor.
            draft.emit(
                node_stream(node.id),
                NodeDisconnected(
                    node_id=node.id, reason="did not reconnect after the control plane started"
                ),
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


def _missing_shards(draft: Draft, fleet: FleetView) -> None:
    for replica in list(draft.state.replicas.values()):
        if replica.phase not in ACTIVE_PHASES or replica.phase is ReplicaPhase.STOPPING:
            continue
        for shard in replica.shards:
            report = fleet.reports.get(shard.node_id)
            if report is None or shard.phase not in (ShardPhase.STARTING, ShardPhase.READY):
                continue
            if (replica.id, shard.index) not in report.shards:
                reason = f"shard {shard.index} no longer runs on {shard.node_id}"
                draft.emit(
                    replica_stream(replica.id), ReplicaLost(replica_id=replica.id, reason=reason)
                )
                break


def _startup_timeouts(draft: Draft) -> None:
    state, now = draft.state, draft.now
    for replica in list(state.replicas.values()):
        if replica.phase not in (ReplicaPhase.PLACED, ReplicaPhase.STARTING):
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


def _shard_outcomes(draft: Draft) -> None:
    for replica in list(draft.state.replicas.values()):
        if replica.phase not in COUNTING_PHASES | {ReplicaPhase.DRAINING}:
            continue
        if replica.phase is ReplicaPhase.DRAINING and (
            stopped := next((s for s in replica.shards if s.stopped_by_agent), None)
        ):
            # It would only serve again to be moved: its replacement is on its way.
            reason = f"shard {stopped.index} stopped by {stopped.node_id}: {stopped.stop_reason}"
            _stop(draft, replica, reason)
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
        elif replica.phase in (ReplicaPhase.PLACED, ReplicaPhase.STARTING) and all(
            s.phase is ShardPhase.READY for s in replica.shards
        ):
            draft.emit(replica_stream(replica.id), ReplicaServing(replica_id=replica.id))


def _startup_timeout_s(state: ClusterState, replica: Replica) -> float:
    model = state.models.get(replica.model)
    return model.spec.startup_timeout_s if model else DEFAULT_STARTUP_TIMEOUT_S


def _stopping_done(draft: Draft, fleet: FleetView) -> None:
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

    Not while its node has not answered the start this control plane sent it at or after
    ``awaited_since``: an agent reports what a start did before answering it, so the engine
    may be coming up still unreported (a shard the log has only placed is not "never
    started" then, and a drain of its node would finish while it starts there). A start
    sent before that and still unanswered no longer counts (an engine the agent starts
    after all is a stray then, stopped as one). A node that has not said hello proves
    nothing: it may be on its way back with the engine still running (a lost node is
    handled with it)."""
    report = fleet.reports.get(shard.node_id)
    sent_at = report.awaited.get(start_command_id(replica.id, shard.index)) if report else None
    if sent_at is not None and sent_at >= awaited_since:
        return False
    return shard.phase in (ShardPhase.STOPPED, ShardPhase.FAILED, ShardPhase.PLACED) or (
        report is not None and (replica.id, shard.index) not in report.shards
    )


def _scale(draft: Draft, *, placing: bool) -> None:
    state = draft.state
    allocations: Allocations | None = None
    by_model: dict[str, list[Replica]] = {}
    for replica in state.replicas.values():
        if replica.phase in ACTIVE_PHASES:
            by_model.setdefault(replica.model, []).append(replica)
    for model in list(state.models.values()):
        replicas = by_model.get(model.name, [])
        if model.removed:
            for replica in replicas:
                if replica.phase is not ReplicaPhase.STOPPING:
                    _stop(draft, replica, "model removed")
            continue
        counting = [r for r in replicas if r.phase in COUNTING_PHASES]
        deficit = model.desired - len(counting)
        if deficit < 0:
            for replica in _scale_down_order(state, model, counting)[:-deficit]:
                _stop(draft, replica, f"scaled down to {model.desired}", surplus=True)
        # A moved replica whose replacement the count now leaves no room for goes with the
        # scale-down: its move would otherwise wait for a replacement never placed.
        for original in waiting_for_replacement(state, state.models[model.name])[max(deficit, 0) :]:
            _stop(draft, original, f"scaled down to {model.desired}", surplus=True)
        if deficit > 0 and placing:
            if model.backoff_until is not None and draft.now < model.backoff_until:
                continue
            if allocations is None:
                allocations = Allocations.from_state(state)
            _place(draft, model, deficit, replicas, allocations)


def _place(
    draft: Draft, model: Model, deficit: int, replicas: list[Replica], allocations: Allocations
) -> None:
    """Place ``deficit`` replicas, the replacements of moved replicas first (in the order
    ``waiting_for_replacement`` gives), each running the revision ``replacement_revisions``
    gives. (``drain_room`` places a node drain's replacements in this same order.)"""
    state = draft.state
    waiting = waiting_for_replacement(state, model)
    originals = [waiting.pop(0) if waiting else None for _ in range(deficit)]
    planned: dict[int, list[Replica | None]] = {}
    for original, revision in zip(
        originals, replacement_revisions(state, model, originals), strict=True
    ):
        planned.setdefault(revision, []).append(original)
    have = model.desired - deficit
    for revision, group in planned.items():
        if not _place_at(draft, model, revision, group, allocations, have):
            return
        have += len(group)


def waiting_for_replacement(state: ClusterState, model: Model) -> list[Replica]:
    """The originals of ``model``'s moves whose replacement is neither on its way nor
    serving, in the order their replacements are placed: by replica number."""
    return sorted(
        (
            original
            for move in model.moves.values()
            if (original := state.replicas.get(move.replica_id)) is not None
            and original.phase is ReplicaPhase.DRAINING
            and not _replaced(state, move.replacement_id)
        ),
        key=lambda r: r.number,
    )


def replacement_revisions(
    state: ClusterState, model: Model, originals: Sequence[Replica | None]
) -> list[int]:
    """The revision each replica placed for ``originals`` (in that order; the replica it
    replaces, or None) runs: the model's, unless a rollout's step has no room for one more
    of it (``new_revision_room``): then the revision the rollout comes from. The
    replacement in a move of the rollout itself is the step's own, and runs the new one."""
    room = new_revision_room(state, model)
    revisions = []
    for original in originals:
        revision = model.revision
        if room is not None and model.rollout is not None:
            if room > 0 or (original is not None and original.drain_id == model.rollout.id):
                room -= 1
            else:
                revision = model.rollout.from_revision
        revisions.append(revision)
    return revisions


def _place_at(
    draft: Draft,
    model: Model,
    revision: int,
    originals: list[Replica | None],
    allocations: Allocations,
    have: int,
) -> bool:
    """Place a replica of ``revision`` for each of ``originals`` (the replica it replaces,
    or None), the model having ``have`` replicas that count; False when one found no node
    (recorded once, as the model's reason, with every replica still missing)."""
    state = draft.state
    spec = model.spec_of(revision)
    placer = Placer(state, spec, allocations)
    for placed, original in enumerate(originals):
        number = state.models[model.name].replicas_created + 1
        replica_id = replica_id_for(model.name, number)
        placement = placer.place(replica_id)
        if placement is None:
            reason = placer.summary()
            if state.models[model.name].unplaceable_reason != reason:
                missing = model.desired - have - placed
                draft.emit(
                    model_stream(model.name),
                    ModelUnplaceable(model=model.name, reason=reason, missing_replicas=missing),
                )
            return False
        reason = (
            f"replacement for {original.id} (drain {original.drain_id})"
            if original
            else f"below desired count ({have + placed} of {model.desired})"
        )
        if revision != model.revision:
            reason += f", at revision {revision}: the rollout's step runs revision "
            reason += f"{model.revision} on no more replicas"
        draft.emit(
            replica_stream(replica_id),
            ReplicaPlaced(
                replica_id=replica_id,
                model=model.name,
                number=number,
                shards=placement,
                reason=reason,
                replaces=original.id if original else None,
                revision=revision,
            ),
            expected_version=0,
            correlation_id=original.drain_id if original else None,
        )
    return True


def _replaced(state: ClusterState, replacement_id: str | None) -> bool:
    """Whether a move's replacement is on its way or serving."""
    replacement = state.replicas.get(replacement_id) if replacement_id is not None else None
    return replacement is not None and replacement.phase in COUNTING_PHASES


def _stop(draft: Draft, replica: Replica, reason: str, *, surplus: bool = False) -> None:
    draft.emit(
        replica_stream(replica.id),
        ReplicaStopping(replica_id=replica.id, reason=reason, surplus=surplus),
        correlation_id=replica.drain_id,
    )


def _scale_down_order(state: ClusterState, model: Model, replicas: list[Replica]) -> list[Replica]:
    """The newest that is not serving yet, then the newest serving. During a rollout's
    step, the step's replicas of the new revision go after the others: scaled down, the
    model keeps its canary (the step's count shrinks with the model only below it)."""
    if new_revision_room(state, model) is None:
        return sorted(replicas, key=lambda r: (r.phase is ReplicaPhase.SERVING, -r.number))
    return sorted(
        replicas,
        key=lambda r: (
            r.phase is ReplicaPhase.SERVING,
            r.revision == model.revision,
            -r.number,
        ),
    )


def _replicas_on(state: ClusterState, node_id: str) -> list[Replica]:
    return [
        r
        for r in state.replicas.values()
        if r.phase in ACTIVE_PHASES and any(s.node_id == node_id for s in r.shards)
    ]


def note_left_routing(left: Mapping[str, int], state: ClusterState) -> dict[str, int]:
    """The stopping replicas, each with the fold's position when first seen out of routing:
    ``left``'s for those it has, ``state``'s own for the others (its leaving is at or before
    the position of the state it is seen in); replicas no longer stopping are dropped."""
    return {
        r.id: left.get(r.id, state.position)
        for r in state.replicas.values()
        if r.phase is ReplicaPhase.STOPPING
    }


def _still_quiescing(replica: Replica, fleet: FleetView, now: datetime, s: Settings) -> bool:
    """A stopping replica keeps running for ``quiesce_s`` (unless every live gateway has
    already applied a routing table without it), then while a gateway reports a request in
    flight on it or a gateway is silent (what it has open is unknown), up to
    ``drain_idle_timeout_s``."""
    if replica.stopping_since is None:
        return False
    waited = (now - replica.stopping_since).total_seconds()
    if waited < s.quiesce_s and not _out_of_every_gateways_routing(replica, fleet):
        return True
    busy = fleet.in_flight.get(replica.id, 0) > 0 or fleet.silent_gateways > 0
    return busy and waited < s.drain_idle_timeout_s


def _out_of_every_gateways_routing(replica: Replica, fleet: FleetView) -> bool:
    """Whether every gateway said, in the report its in-flight counts come from, that it
    routed by a table from after the replica left routing: none sends it anything new. Not
    while a gateway is silent: which table it routes by is unknown."""
    left = fleet.left_routing.get(replica.id)
    return (
        left is not None
        and fleet.routing_seen is not None
        and fleet.routing_seen >= left
        and fleet.silent_gateways == 0
    )


def _commands(draft: Draft, fleet: FleetView, settings: Settings) -> None:
    state = draft.state
    for replica in state.replicas.values():
        model = state.models.get(replica.model)
        if replica.phase in ACTIVE_PHASES and replica.phase is not ReplicaPhase.STOPPING:
            for shard in replica.shards:
                report = fleet.reports.get(shard.node_id)
                if (
                    model is not None
                    and (shard.phase is ShardPhase.PLACED or shard.stopped_by_agent)
                    and report is not None
                    and (replica.id, shard.index) not in report.shards
                ):
                    command: StartShard | StopShard = start_command(
                        state, model.spec_of(replica.revision), replica, shard
                    )
                    draft.command(shard.node_id, command)
            continue
        if replica.phase is ReplicaPhase.STOPPING and _still_quiescing(
            replica, fleet, draft.now, settings
        ):
            continue
        if replica.phase is ReplicaPhase.STOPPING or replica.phase in STOPPED_BY_PLAN:
            grace = model.spec.stop_grace_s if model else 30.0
            for shard in replica.shards:
                report = fleet.reports.get(shard.node_id)
                running = report.shards.get((replica.id, shard.index)) if report else None
                if running is not None and running.running and running.port == shard.port:
                    draft.command(shard.node_id, stop_command(replica.id, shard.index, grace))
