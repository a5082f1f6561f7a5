"""Traffic as the gateways measured it: a replica's for ``GET /admin/v1/replicas/{id}``, a
model's per revision for ``GET /admin/v1/models/{name}``."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Protocol, runtime_checkable

import msgspec

from app.admin.replica_schemas import ReplicaTrafficView, ReplicaView
from app.domain.state import ACTIVE_PHASES, Replica
from app.domain.traffic import TrafficFigures
from app.store.gateway_reports import Ejections


@runtime_checkable  # Litestar checks a dependency's value against its annotation
class TrafficSource(Protocol):
    """``app.store.gateway_reports.TrafficReports``: the fresh gateway reports, merged."""

    async def replica_traffic(self, replica_id: str) -> TrafficFigures | None: ...

    async def traffic_of_groups(
        self, groups: Mapping[str, Collection[str]]
    ) -> dict[str, TrafficFigures]: ...

    async def ejections(self) -> Ejections: ...


def traffic_view(figures: TrafficFigures) -> ReplicaTrafficView:
    return msgspec.convert(msgspec.to_builtins(figures), ReplicaTrafficView)


def with_traffic(view: ReplicaView, figures: TrafficFigures | None) -> ReplicaView:
    """``view`` with what the gateways measured (none: ``traffic`` stays null)."""
    if figures is None:
        return view
    return msgspec.structs.replace(view, traffic=traffic_view(figures))


def traffic_by_revision(
    replicas: Iterable[Replica],
) -> dict[str, list[str]]:
    """The active replicas by the revision they run, keyed by its number as text."""
    groups: dict[str, list[str]] = {}
    for replica in replicas:
        if replica.phase in ACTIVE_PHASES:
            groups.setdefault(str(replica.revision), []).append(replica.id)
    return groups
