"""What a rollout's verdict reads: the groups of replicas whose gateway figures it judges
(the new revision's, the canary, and the model's others, the stable side), and the
replicas of each the gateways keep out of rotation for failing. The reconciler reads them
for the verdicts of a pass, the rollout status for what a verdict would wait for.

A replica ejected for a while during a hold may be back in rotation when the hold ends:
``ejected_during_holds`` keeps, for each step that holds, every replica of the model some
gateway ejected on a pass since the hold began (or since this leader took over: it is the
leader's memory, not the log's), so the verdict counts it all the same."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import msgspec

from app.domain.rollout_convergence import active_replicas
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
    replicas gateways eject, with how many of them do."""
    rollout = model.rollout
    if rollout is None or not verdict_groups(model, replicas):
        return None
    return waiting_for(
        traffic.get(canary_group(model.name)),
        traffic.get(stable_group(model.name)),
        model.spec.rollout,
        sides_ejected(replicas, model, rollout, ejected),
    )


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


class HoldEjections(msgspec.Struct, frozen=True, kw_only=True):
    """The replicas of a model the gateways ejected during one hold of its rollout's step:
    replica id -> the most gateways that ejected it at once."""

    rollout_id: str
    step: int
    holding_since: datetime
    ejected: dict[str, int]


def ejected_during_holds(
    seen: Mapping[str, HoldEjections], state: ClusterState, ejected_now: Mapping[str, int]
) -> dict[str, HoldEjections]:
    """``seen`` (by model) with the ejections of this pass added, for each model whose
    rollout holds a step (paused in it too, for its verdict when resumed): the model's
    active replicas some gateway ejects now or ejected earlier in the hold, each with the
    most gateways seen ejecting it at once. A hold that began since (a new step, a hold
    started over) starts with nothing; a model that holds no step, and a replica no longer
    active, are dropped: as bounded as the replicas the verdicts read."""
    holds: dict[str, HoldEjections] = {}
    for name, model in state.models.items():
        rollout = model.rollout
        if (
            rollout is None
            or rollout.state not in (RolloutState.RUNNING, RolloutState.PAUSED)
            or rollout.holding_since is None
        ):
            continue
        before = seen.get(name)
        earlier: Mapping[str, int] = {}
        if before is not None and (before.rollout_id, before.step, before.holding_since) == (
            rollout.id,
            rollout.step,
            rollout.holding_since,
        ):
            earlier = before.ejected
        ejected: dict[str, int] = {}
        for replica in active_replicas(state, name):
            most = max(earlier.get(replica.id, 0), ejected_now.get(replica.id, 0))
            if most > 0:
                ejected[replica.id] = most
        holds[name] = HoldEjections(
            rollout_id=rollout.id,
            step=rollout.step,
            holding_since=rollout.holding_since,
            ejected=ejected,
        )
    return holds


def ejected_in_holds(holds: Mapping[str, HoldEjections]) -> dict[str, int]:
    """Every replica ejected during its model's hold, as ``FleetView.ejected`` has them."""
    return {rid: n for hold in holds.values() for rid, n in hold.ejected.items()}
