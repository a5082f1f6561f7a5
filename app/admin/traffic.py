"""A replica's traffic as the gateways measured it, for ``GET /admin/v1/replicas/{id}``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from app.admin.schemas import ReplicaTrafficView, ReplicaView
from app.domain.traffic import TrafficFigures


@runtime_checkable  # Litestar checks a dependency's value against its annotation
class TrafficSource(Protocol):
    """``app.store.gateway_reports.TrafficReports``: the fresh gateway reports, merged."""

    async def replica_traffic(self, replica_id: str) -> TrafficFigures | None: ...


def traffic_view(figures: TrafficFigures) -> ReplicaTrafficView:
    return msgspec.convert(msgspec.to_builtins(figures), ReplicaTrafficView)


def with_traffic(view: ReplicaView, figures: TrafficFigures | None) -> ReplicaView:
    """``view`` with what the gateways measured (none: ``traffic`` stays null)."""
    if figures is None:
        return view
    return msgspec.structs.replace(view, traffic=traffic_view(figures))
