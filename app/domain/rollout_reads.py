"""What a rollout's verdict reads: the groups of replicas whose gateway figures it judges
(the new revision's, the canary, and the model's others, the stable side), and the
replicas of each the gateways keep out of rotation for failing. The reconciler reads them
for the verdicts of a pass, the rollout status for what a verdict would wait for.

A replica ejected for a while during a hold may be back in rotation when the hold ends:
the log keeps, for the step that holds, every replica of the model some gateway ejected
on a pass since the hold began (``Rollout.hold_ejections``, ``app.domain.hold_ejections``),
so the verdict counts it all the same, whichever control plane leads when it is taken."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.domain.rollout_verdict import Ejected, waiting_for
from app.domain.state import (
    ACTIVE_PHASES,
    ClusterState,
    Model,
    Replica,
    Rollout,
    RolloutState,
)
from app.domain.traffic import TrafficFigures


def canary_group(model: str) -> str:
    """The key of a model's new-revision replicas in ``FleetView.traffic``."""
    return f"{model} canary"


def stable_group(model: str) -> str:
    """The key of a model's other replicas in ``FleetView.traffic``."""
    return f"{model} stable"


def traffic_wanted(state: ClusterState) -> dict[str, list[str]]:
    """The replicas whose gateway figures the verdicts of this pass need, by group: for each
    rollout holding a step, its new revision's active replicas and the model's others.
    Empty (nothing to read) when no rollout holds."""
    wanted: dict[str, list[str]] = {}
    holding = {
        name: model.rollout.revision
        for name, model in state.models.items()
        if model.rollout is not None
        and model.rollout.state is RolloutState.RUNNING
        and model.rollout.holding_since is not None
    }
    if not holding:
        return wanted
    for replica in state.replicas.values():
        revision = holding.get(replica.model)
        if revision is None or replica.phase not in ACTIVE_PHASES:
            continue
        group = canary_group if replica.revision == revision else stable_group
        wanted.setdefault(group(replica.model), []).append(replica.id)
    return wanted


def verdict_groups(model: Model, replicas: Iterable[Replica]) -> dict[str, list[str]]:
    """The groups a verdict of ``model``'s rollout would read now (as ``traffic_wanted``):
    its new revision's active replicas and the model's others; empty when the rollout
    holds no step."""
    rollout = model.rollout
    if (
        rollout is None
        or rollout.state is not RolloutState.RUNNING
        or rollout.holding_since is None
    ):
        return {}
    groups: dict[str, list[str]] = {}
    for replica in replicas:
        if replica.model != model.name or replica.phase not in ACTIVE_PHASES:
            continue
        group = canary_group if replica.revision == rollout.revision else stable_group
        groups.setdefault(group(model.name), []).append(replica.id)
    return groups


def verdict_waits_for(
    model: Model,
    replicas: Iterable[Replica],
    traffic: Mapping[str, TrafficFigures],
    ejected: Mapping[str, int],
) -> str | None:
    """What the verdict of ``model``'s holding step, taken on these figures now, would still
    wait for (too few requests or latency samples on a side, with the counts); None when it
    would decide, or no step holds. ``traffic`` by ``verdict_groups``; ``ejected``: the
    replicas gateways eject now, with how many of them do; those the log says they ejected
    earlier in the hold count too (``ejected_in_hold``)."""
    rollout = model.rollout
    replicas = list(replicas)
    if rollout is None or not verdict_groups(model, replicas):
        return None
    waits = waiting_for(
        traffic.get(canary_group(model.name)),
        traffic.get(stable_group(model.name)),
        model.spec.rollout,
        sides_ejected(replicas, model, rollout, ejected_in_hold(rollout, ejected)),
    )
    if waits is None:
        return None
    return none_to_judge_against(model, replicas) or waits


def none_to_judge_against(model: Model, replicas: Iterable[Replica]) -> str | None:
    """Why a verdict of ``model``'s holding step has nothing to compare the new revision
    with: none of its active replicas runs another revision (the model's count came down
    to the step's, by the autoscaler or ``scale``). None while one does."""
    rollout = model.rollout
    if rollout is None:
        return None
    active = [r for r in replicas if r.model == model.name and r.phase in ACTIVE_PHASES]
    if not active or any(r.revision != rollout.revision for r in active):
        return None
    return (
        f"revision {rollout.revision} runs on every replica of the model ({len(active)}): "
        "none of another revision is left to judge the step against"
    )


def ejected_in_hold(rollout: Rollout, ejected_now: Mapping[str, int]) -> dict[str, int]:
    """The replicas ejected during ``rollout``'s hold as the log has them, with those
    ejected now that it has not recorded yet: each with the most gateways ejecting it at
    once."""
    ejected = dict(rollout.hold_ejections)
    for replica_id, gateways in ejected_now.items():
        if gateways > ejected.get(replica_id, 0):
            ejected[replica_id] = gateways
    return ejected


def sides_ejected(
    replicas: Iterable[Replica], model: Model, rollout: Rollout, ejected: Mapping[str, int]
) -> Ejected:
    """The model's active replicas the gateways eject, by the side of the verdict."""
    canary: dict[str, int] = {}
    stable: dict[str, int] = {}
    for replica in replicas:
        if replica.model != model.name or replica.phase not in ACTIVE_PHASES:
            continue
        gateways = ejected.get(replica.id, 0)
        if gateways > 0:
            side = canary if replica.revision == rollout.revision else stable
            side[replica.id] = gateways
    return Ejected(canary=canary, stable=stable)
