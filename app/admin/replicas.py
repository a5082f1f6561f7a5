"""``/admin/v1/replicas``: replicas with their shards, failures and engine log tails, how
many live gateways eject each, and one replica's traffic as the gateways measured it (a
replica's drain is in ``app.admin.drains``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, TypeVar

from litestar import get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter

from app.admin.guarded import GuardedController
from app.admin.replica_schemas import ReplicaEjectionView, ReplicaSummary, ReplicaView
from app.admin.schemas import as_view
from app.admin.traffic import TrafficSource, with_traffic
from app.domain.state import Replica, ReplicaPhase
from app.services.operations import Operations
from app.store.gateway_reports import Ejections

SummaryT = TypeVar("SummaryT", bound=ReplicaSummary)


def replica_summary(
    replica: Replica, revisions: Mapping[str, int], ejections: Ejections | None = None
) -> ReplicaSummary:
    """``revisions``: the current revision of models by name, to say whether the replica
    runs an older one; ``ejections``: what the live gateways say of ejections, if asked."""
    return _replica_as(ReplicaSummary, replica, revisions, ejections)


def replica_view(
    replica: Replica, revisions: Mapping[str, int], ejections: Ejections | None = None
) -> ReplicaView:
    """As ``replica_summary``, with its shards, their errors and log tails."""
    return _replica_as(ReplicaView, replica, revisions, ejections)


def _replica_as(
    view: type[SummaryT],
    replica: Replica,
    revisions: Mapping[str, int],
    ejections: Ejections | None,
) -> SummaryT:
    return as_view(
        replica,
        view,
        nodes=list(replica.node_ids),
        current_revision=revisions.get(replica.model),
        ejection=ejection_view(replica.id, ejections),
    )


def ejection_view(replica_id: str, ejections: Ejections | None) -> ReplicaEjectionView | None:
    """None when no live gateway reports ejections."""
    if ejections is None or ejections.gateways == 0:
        return None
    return ReplicaEjectionView(
        ejected_by=min(ejections.ejected_by.get(replica_id, 0), ejections.gateways),
        gateways=ejections.gateways,
    )


class ReplicaController(GuardedController):
    path = "/admin/v1/replicas"
    tags = ["replicas"]

    @get(
        "/",
        summary="Replicas, by model, node and phase when given, and how many live gateways "
        "eject each",
    )
    async def list_replicas(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        model: FromQuery[str | None] = None,
        node: Annotated[str | None, QueryParameter(description="with a shard on this node")] = None,
        phase: FromQuery[ReplicaPhase | None] = None,
    ) -> list[ReplicaSummary]:
        replicas = await operations.replicas(model, node, phase)
        revisions = await operations.revisions(replicas)
        ejections = await traffic.ejections()
        return [replica_summary(r, revisions, ejections) for r in replicas]

    @get(
        "/{replica_id:str}",
        summary="A replica: shards, their state, errors and log tails, and its traffic",
    )
    async def show(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        replica_id: FromPath[str],
    ) -> ReplicaView:
        replica = await operations.replica(replica_id)
        revisions = await operations.revisions([replica])
        view = replica_view(replica, revisions, await traffic.ejections())
        return with_traffic(view, await traffic.replica_traffic(replica_id))
