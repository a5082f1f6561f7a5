"""``/admin/v1/replicas``: replicas with their shards, failures and engine log tails, how
many live gateways eject each, which of their GPUs another node holds the UUID of
(``app.domain.gpu_claims``: by node in the list, with the holder in one replica's view),
one replica's traffic as the gateways measured it, and forgetting the replicas that ended
before a cutoff (``app.domain.replica_retention``; a replica's drain is in
``app.admin.drains``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, TypeVar

import msgspec
from litestar import Response, get, post
from litestar.datastructures import ResponseHeader
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from app.admin.guarded import GuardedController
from app.admin.operation_schema import refusal
from app.admin.problem_schemas import UnknownThingProblem
from app.admin.replica_schemas import (
    EndedReplicasForgetting,
    ForgetEndedRequest,
    GpuHeldElsewhereView,
    ReplicaEjectionView,
    ReplicaSummary,
    ReplicaView,
    ShardView,
)
from app.admin.schemas import as_view
from app.admin.traffic import TrafficSource, with_traffic
from app.domain.gpu_claims import HeldElsewhere, gpus_held_elsewhere, held_elsewhere_reason
from app.domain.state import ACTIVE_PHASES, Node, Replica, ReplicaPhase
from app.services.operations import Caller, Operations
from app.store.gateway_reports import Ejections

SummaryT = TypeVar("SummaryT", bound=ReplicaSummary)
MAX_REPLICAS_PER_PAGE = 5000
"""The largest ``limit`` of a page of replicas, as of a page of keys or of history."""
MAX_REPLICA_ID_LENGTH = 128
"""Longer than any replica id (a model name of at most 63 characters, ``-`` and its
number): a longer ``after`` names none."""
ENDED_LEFT_OUT_HEADER = "X-Ended-Replicas-Left-Out"
"""On a list without the ended replicas (``ended=false``): ``true`` when ended replicas that
the filters match were left out, ``false`` when none was (a client need not say that ended
ones are hidden when there are none)."""
NO_NODES: Mapping[str, Node] = MappingProxyType({})
NOTHING_HELD_ELSEWHERE: HeldElsewhere = MappingProxyType({})


def replica_summary(
    replica: Replica,
    revisions: Mapping[str, int],
    ejections: Ejections | None = None,
    elsewhere: HeldElsewhere = NOTHING_HELD_ELSEWHERE,
) -> ReplicaSummary:
    """``revisions``: the current revision of models by name, to say whether the replica
    runs an older one; ``ejections``: what the live gateways say of ejections, if asked;
    ``elsewhere``: the GPUs another node holds the UUID of (``gpus_held_elsewhere``), to
    say which of its shards' GPUs are among them while it is active."""
    return _replica_as(ReplicaSummary, replica, revisions, ejections, elsewhere)


def replica_view(
    replica: Replica,
    revisions: Mapping[str, int],
    ejections: Ejections | None = None,
    nodes: Mapping[str, Node] = NO_NODES,
) -> ReplicaView:
    """As ``replica_summary``, with its shards, their errors and log tails, and, while it
    is active, which of their GPUs another node holds the UUID of (``nodes``: the nodes as
    the log has them now)."""
    elsewhere = gpus_held_elsewhere(nodes.values())
    view = _replica_as(ReplicaView, replica, revisions, ejections, elsewhere)
    if replica.phase not in ACTIVE_PHASES:
        return view
    shards = [
        msgspec.structs.replace(shard, gpus_held_elsewhere=_held_elsewhere(shard, nodes, elsewhere))
        for shard in view.shards
    ]
    return msgspec.structs.replace(view, shards=shards)


def _held_elsewhere(
    shard: ShardView, nodes: Mapping[str, Node], elsewhere: HeldElsewhere
) -> list[GpuHeldElsewhereView]:
    holders = elsewhere.get(shard.node_id, {})
    node = nodes.get(shard.node_id)
    if node is None or not holders:
        return []
    uuids = {gpu.index: gpu.uuid for gpu in node.gpus}
    return [
        GpuHeldElsewhereView(
            index=index,
            uuid=uuids[index],
            held_by=holders[index],
            reason=held_elsewhere_reason(uuids[index], holders[index]),
        )
        for index in shard.gpus
        if index in holders
    ]


def _replica_as(
    view: type[SummaryT],
    replica: Replica,
    revisions: Mapping[str, int],
    ejections: Ejections | None,
    elsewhere: HeldElsewhere,
) -> SummaryT:
    return as_view(
        replica,
        view,
        nodes=list(replica.node_ids),
        current_revision=revisions.get(replica.model),
        ejection=ejection_view(replica.id, ejections),
        held_elsewhere_gpus=_gpus_held_elsewhere_by_node(replica, elsewhere),
    )


def _gpus_held_elsewhere_by_node(
    replica: Replica, elsewhere: HeldElsewhere
) -> dict[str, list[int]]:
    """Its nodes with a GPU of its shards another node holds the UUID of, and those GPUs'
    indexes, while it is active: the list flags it, the replica's view says which node
    holds each."""
    if replica.phase not in ACTIVE_PHASES:
        return {}
    found: dict[str, list[int]] = {}
    for shard in replica.shards:
        holders = elsewhere.get(shard.node_id, {})
        held = [index for index in shard.gpus if index in holders]
        if held:
            found.setdefault(shard.node_id, []).extend(held)
    return {node_id: sorted(indexes) for node_id, indexes in found.items()}


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
        description="Every replica the log knows, by model then number; without ended ones "
        "with `ended=false` (an ended `phase` with it matches none). Without `limit`, every "
        "such replica in one answer. With `limit`, at most that many, after the replica whose "
        "id is `after` when given: pass the last replica's id as `after` for the next page; a "
        "page with fewer than `limit` replicas is the last (a full one may be followed by an "
        "empty one). An `after` that names no replica the log knows is refused (404). With "
        f"`ended=false`, `{ENDED_LEFT_OUT_HEADER}` says whether any ended replica the "
        "filters match was left out, of the whole list and not only of this page.",
        response_headers=[
            ResponseHeader(
                name=ENDED_LEFT_OUT_HEADER,
                description="With ended=false only: true when ended replicas the model, node "
                "and phase match were left out of the list (of every page), false when none "
                "was",
                # Documentation only, the handler sets it: the value gives the schema its
                # type (a string, true or false).
                documentation_only=True,
                value="false",
                required=False,
            )
        ],
        responses={
            404: refusal(
                UnknownThingProblem, "No replica has the id that after names (unknown-replica)"
            )
        },
    )
    async def list_replicas(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        model: FromQuery[str | None] = None,
        node: Annotated[str | None, QueryParameter(description="with a shard on this node")] = None,
        phase: FromQuery[ReplicaPhase | None] = None,
        ended: Annotated[
            bool,
            QueryParameter(
                description="false: leave out the replicas in an ended phase (stopped, failed, "
                "timed_out, lost)"
            ),
        ] = True,
        after: Annotated[
            str | None,
            QueryParameter(
                min_length=1,
                max_length=MAX_REPLICA_ID_LENGTH,
                description="list the replicas after the one with this id",
            ),
        ] = None,
        limit: Annotated[
            int | None,
            QueryParameter(ge=1, le=MAX_REPLICAS_PER_PAGE, description="page size"),
        ] = None,
    ) -> Response[list[ReplicaSummary]]:
        replicas = await operations.replicas(
            model, node, phase, ended=ended, after=after, limit=limit
        )
        revisions = await operations.revisions(replicas)
        ejections = await traffic.ejections()
        elsewhere = gpus_held_elsewhere((await operations.current()).nodes.values())
        listed = [replica_summary(r, revisions, ejections, elsewhere) for r in replicas]
        if ended:
            return Response(listed)
        left_out = await operations.ended_left_out(model, node, phase)
        return Response(listed, headers={ENDED_LEFT_OUT_HEADER: str(left_out).lower()})

    @post(
        "/forget-ended",
        status_code=200,
        summary="Forget the replicas that ended before a cutoff, keeping their history",
        description="Every replica that ended (stopped, failed, timed_out, lost) at or before "
        "`before`, or more than `older_than_s` seconds ago, leaves the replica list and the "
        "projection tables for good; replicas not ended are never touched, their numbers are "
        "never given again, and the log keeps every event about each (its history still "
        "answers). The cutoff must be at least an hour ago (else 400, invalid-cutoff). "
        "Recorded as one `ended_replicas_forgotten` per model with any.",
    )
    async def forget_ended(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        data: JSONBody[ForgetEndedRequest],
    ) -> EndedReplicasForgetting:
        done = await operations.forget_ended_replicas(caller, data.before, data.older_than_s)
        return EndedReplicasForgetting(
            before=done.before,
            forgotten=done.replicas,
            models=done.models,
            changed=done.replicas > 0,
        )

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
        nodes = (await operations.current()).nodes
        view = replica_view(replica, revisions, await traffic.ejections(), nodes)
        return with_traffic(view, await traffic.replica_traffic(replica_id))
