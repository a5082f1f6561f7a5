"""Which replicas a gateway's traffic report keeps when it must leave some out. Pure, no I/O.

A report lists a bounded number of replicas (``app.store.gateway_reports``). Past that, it
keeps first the replicas of the models in a rollout's canary step, whatever their traffic,
then the busiest of the rest. A canary step's verdict is inconclusive while a live
gateway's report may have left out replicas of the model in the rollout
(``TrafficFigures.unlisted``): kept by traffic alone, a model quieter than the busiest
replicas of a crowded gateway would stall at every step, though the gateway saw every
request of it. When the canary models' replicas alone are more than a report lists, the
busiest of them are kept, and the report names the models it left out as ever
(``app.domain.traffic_left_out``).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping

from app.domain.traffic import ReplicaTraffic
from app.domain.traffic_left_out import model_of_replica

Ranked = list[tuple[str, ReplicaTraffic]]


def in_canary_step(
    replica_ids: Iterable[str], canaries: Container[str], routed: Mapping[str, str]
) -> frozenset[str]:
    """Those of ``replica_ids`` whose model is in a canary step (``canaries``): the model the
    routing snapshot routes each one for (``routed``: replica id -> model), else the one its
    id names, as a report's reader names it (a replica just taken out of routing still has
    requests in the window)."""
    return frozenset(
        replica_id
        for replica_id in replica_ids
        if (routed.get(replica_id) or model_of_replica(replica_id)) in canaries
    )


def kept_and_left(
    replicas: Mapping[str, ReplicaTraffic], most: int, first: Collection[str] = frozenset()
) -> tuple[Ranked, Ranked]:
    """``replicas`` split into the at most ``most`` a report keeps and those it leaves out:
    those in ``first`` before any other, then the busiest (requests answered, failed or
    cancelled). Each part in ascending order of that rank, the ties as ``replicas`` has
    them."""
    ranked = sorted(
        replicas.items(),
        key=lambda item: (item[0] in first, item[1].requests + item[1].cancelled),
    )
    cut = max(len(ranked) - most, 0)
    return ranked[cut:], ranked[:cut]
