"""The replicas the gateways eject during a rollout's hold, recorded in the log.

A canary the gateways eject for failing early in a hold may be back in rotation when the
hold ends, and its step's verdict must count it all the same, whichever control plane
leads by then. So what the verdict judges on is in the log: each pass, for every rollout
holding a step (paused in it too, for its verdict once resumed), a replica of the model
that more live gateways eject at once than recorded so far in this hold is recorded
(``RolloutHoldEjectionSeen``, on the model's stream under the rollout's id). The fold keeps
them on the rollout (``Rollout.hold_ejections``) until a step starts or its hold starts
over. Recorded once per rise in the count, never per pass: a replica two gateways eject
for an hour is at most two events.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.domain.decision import Draft
from app.domain.events import RolloutHoldEjectionSeen, model_stream
from app.domain.rollout_convergence import active_replicas
from app.domain.state import RolloutState

HOLDS_RECORDED = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})


def record_hold_ejections(draft: Draft, ejected: Mapping[str, int]) -> None:
    """Record, for each rollout holding a step, its model's active replicas that more
    gateways eject now than recorded in this hold; ``ejected``: the replicas live gateways
    keep out of rotation for failing now, each with how many of them do
    (``FleetView.ejected``)."""
    if not ejected:
        return
    for name in sorted(draft.state.models):
        rollout = draft.state.models[name].rollout
        if rollout is None or rollout.state not in HOLDS_RECORDED or rollout.holding_since is None:
            continue
        for replica in sorted(active_replicas(draft.state, name), key=lambda r: r.id):
            gateways = ejected.get(replica.id, 0)
            if gateways <= rollout.hold_ejections.get(replica.id, 0):
                continue
            draft.emit(
                model_stream(name),
                RolloutHoldEjectionSeen(
                    model=name,
                    rollout_id=rollout.id,
                    step=rollout.step,
                    replica_id=replica.id,
                    gateways=gateways,
                ),
                correlation_id=rollout.id,
            )
