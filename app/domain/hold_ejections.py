"""The replicas the gateways eject during a rollout's hold, recorded in the log.

A canary the gateways eject for failing early in a hold may be back in rotation when the
hold ends, and its step's verdict must count it all the same, whichever control plane
leads by then. So what the verdict judges on is in the log: each pass, for every rollout
holding a step (paused in it too, for its verdict once resumed), a replica of the model
that more live gateways eject at once than recorded so far in this hold is recorded
(``RolloutHoldEjectionSeen``, on the model's stream under the rollout's id). The fold keeps
them on the rollout (``Rollout.hold_ejections``) until a step starts or its hold starts
over. Recorded once per rise in the count, never per pass: a replica two gateways eject
for an hour is at most two events. The reconciler reads the gateways' ejections of the
replicas ``ejections_wanted`` names, a paused hold's too, while it reads their figures
only for a verdict it may reach (``app.domain.rollout_reads.traffic_wanted``).
"""

from __future__ import annotations

from collections.abc import Mapping

from app.domain.decision import Draft
from app.domain.events import RolloutHoldEjectionSeen
from app.domain.rollout import record_on_model
from app.domain.rollout_convergence import active_replicas
from app.domain.state import ClusterState, Rollout, RolloutState

HOLDS_RECORDED = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})


def holds_recorded(rollout: Rollout | None) -> bool:
    """Whether the rollout holds a step whose ejections are recorded: running, or paused
    in it."""
    return (
        rollout is not None
        and rollout.state in HOLDS_RECORDED
        and rollout.holding_since is not None
    )


def ejections_wanted(state: ClusterState) -> frozenset[str]:
    """The replicas whose ejections by the gateways a pass records: the active replicas of
    each model whose rollout holds a step, running or paused. Empty (nothing to read) when
    no rollout holds one."""
    return frozenset(
        replica.id
        for name, model in state.models.items()
        if holds_recorded(model.rollout)
        for replica in active_replicas(state, name)
    )


def record_hold_ejections(draft: Draft, ejected: Mapping[str, int]) -> None:
    """Record, for each rollout holding a step, its model's active replicas that more
    gateways eject now than recorded in this hold; ``ejected``: the replicas live gateways
    keep out of rotation for failing now, each with how many of them do
    (``FleetView.ejected``)."""
    if not ejected:
        return
    for name in sorted(draft.state.models):
        rollout = draft.state.models[name].rollout
        if rollout is None or not holds_recorded(rollout):
            continue
        for replica in sorted(active_replicas(draft.state, name), key=lambda r: r.id):
            gateways = ejected.get(replica.id, 0)
            if gateways <= rollout.hold_ejections.get(replica.id, 0):
                continue
            record_on_model(
                draft,
                rollout,
                RolloutHoldEjectionSeen(
                    model=name,
                    rollout_id=rollout.id,
                    step=rollout.step,
                    replica_id=replica.id,
                    gateways=gateways,
                ),
            )
