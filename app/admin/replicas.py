"""``/admin/v1/replicas``: replicas with their shards, failures and engine log tails, and
one replica's traffic as the gateways measured it (a replica's drain is in
``app.admin.drains``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter

from app.admin.auth import require_actor
from app.admin.bodies import check_body
from app.admin.schemas import ReplicaSummary, ReplicaView, as_view
from app.admin.traffic import TrafficSource, with_traffic
from app.domain.state import Replica, ReplicaPhase
from app.services.operations import Operations


def replica_summary(replica: Replica, revisions: Mapping[str, int]) -> ReplicaSummary:
    """``revisions``: the current revision of models by name, to say whether the replica
    runs an older one."""
    return as_view(
        replica,
        ReplicaSummary,
        nodes=list(replica.node_ids),
        current_revision=revisions.get(replica.model),
    )


def replica_view(replica: Replica, revisions: Mapping[str, int]) -> ReplicaView:
    return as_view(
        replica,
        ReplicaView,
        nodes=list(replica.node_ids),
        current_revision=revisions.get(replica.model),
    )


class ReplicaController(Controller):
    path = "/admin/v1/replicas"
    guards = [require_actor, check_body]
    tags = ["replicas"]

    @get("/", summary="Replicas, by model, node and phase when given")
    async def list_replicas(
        self,
        operations: NamedDependency[Operations],
        model: FromQuery[str | None] = None,
        node: Annotated[str | None, QueryParameter(description="with a shard on this node")] = None,
        phase: FromQuery[ReplicaPhase | None] = None,
    ) -> list[ReplicaSummary]:
        replicas = await operations.replicas(model, node, phase)
        revisions = await operations.revisions(replicas)
        return [replica_summary(r, revisions) for r in replicas]

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
        view = replica_view(replica, await operations.revisions([replica]))
        return with_traffic(view, await traffic.replica_traffic(replica_id))
