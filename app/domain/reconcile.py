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
   a replica with a shard at a port outside its node's current port range (its agent came
   back with another one), still to start there or reported running there, is stopped,
   not failed: it could never start there, nor keep its port, and its replacement is
   placed within the range without backoff (``ports_out_of_range``; adoption leaves such
   an engine of the log's to this rule rather than stopping it as a stray);
6. stopping replicas whose shards are gone (none that a node reports running, whatever
   the log has of it) are stopped (rules 2-6: ``replica_outcomes``);
7. autoscaled models are scaled to the demand gateways report (``autoscale``);
8. rollouts advance and are judged (``rollout``); what the verdict judges by is recorded
   first, before rule 7 and during the adoption grace too: the replicas gateways eject
   during a rollout's hold (``hold_ejections``);
9. a replica serving or starting on a GPU its node reports unhealthy is moved, as a
   replica drain without grace, paced by its model's ``max_moves`` as a node drain is
   (``gpu_moves``); drains move replicas (see ``drain``);
10. each model is brought to its desired count (placement, or stopping the newest:
    ``desired_count``);
11. commands: start placed shards (and shards their agents stopped on purpose), stop what
    should not run (a replica taken out of routing once gateways report nothing in flight
    on it, or after a timeout: ``shard_commands``).

The numbers are docs/reconciler.md's. Rules 2-4, 7 and 8, the moves off unhealthy GPUs
of rule 9 and the placements of rule 10 wait for the adoption grace after a start, so a
control plane never races its own agents; the grace follows the fleet
(``adoption_grace``).
The timings are ``Settings`` (``reconcile_settings``). A pass's run is appended only while
no operator's change since made it wrong (``overtaken``, re-exported here with the
others the reconciler service imports).
"""

from __future__ import annotations

from datetime import datetime

from app.domain import autoscale
from app.domain.adoption import adopt_reported
from app.domain.adoption_grace import AdoptionGrace, GraceState, grace_state
from app.domain.decision import AUTOSCALER, Decision, Draft
from app.domain.desired_count import scale_to_desired
from app.domain.drain import drain_moves
from app.domain.events import ModelScaled, model_stream
from app.domain.gpu_moves import move_off_unhealthy_gpus
from app.domain.hold_ejections import record_hold_ejections
from app.domain.overtaken import overtaken
from app.domain.ports_out_of_range import stop_ports_out_of_range
from app.domain.reconcile_settings import (
    DEFAULT_DRAIN_IDLE_TIMEOUT_S,
    DEFAULT_LOST_TIMEOUT_S,
    DEFAULT_STABILITY_WINDOW_S,
    Settings,
)
from app.domain.replica_outcomes import (
    missing_shards,
    nodes_gone,
    shard_outcomes,
    startup_timeouts,
    stopping_done,
)
from app.domain.reports import FleetView
from app.domain.rollout import rollout_moves
from app.domain.shard_commands import note_left_routing, shard_commands
from app.domain.state import ClusterState

__all__ = [
    "DEFAULT_DRAIN_IDLE_TIMEOUT_S",
    "DEFAULT_LOST_TIMEOUT_S",
    "DEFAULT_STABILITY_WINDOW_S",
    "Settings",
    "adoption_grace_state",
    "decide",
    "in_adoption_grace",
    "note_left_routing",
    "overtaken",
]


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
        nodes_gone(draft, fleet, settings)
        missing_shards(draft, fleet)
        startup_timeouts(draft)
    shard_outcomes(draft, fleet)
    stop_ports_out_of_range(draft, fleet)
    stopping_done(draft, fleet)
    # What the gateways eject is theirs to say, grace or not; recorded before a verdict.
    record_hold_ejections(draft, fleet.ejected)
    if not grace:
        _autoscale(draft, fleet)
        rollout_moves(draft, fleet.traffic)
        move_off_unhealthy_gpus(draft)
    drain_moves(
        draft,
        settings.stability_window_s,
        settings.replica_drain_grace_s,
        reports=fleet.reports,
    )
    scale_to_desired(draft, placing=not grace, running=fleet.reports)
    shard_commands(draft, fleet, settings)
    return draft.decision()


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
