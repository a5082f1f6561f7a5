"""``/admin/v1/nodes``: the GPU machines, cordon and uncordon of a node or of one of its
GPUs, forgetting a retired node (a node's drain is in ``app.admin.drains``). A node's GPUs
show the memory in use that placement reads: the leader's latest reading, else the hello's
(``app.domain.allocation``), and every reason placement puts no new shard on a GPU."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from app.admin.bodies import NoBody
from app.admin.guarded import GuardedController
from app.admin.node_schemas import (
    ConnectionView,
    CordonRequest,
    ForgetRequest,
    GpuView,
    NodeChange,
    NodeDrainView,
    NodeForgetting,
    NodeReplicaView,
    NodeSummary,
    NodeView,
    UnlistedGpuCordonView,
)
from app.admin.schemas import as_view
from app.domain.allocation import Allocations
from app.domain.events import GpuInfo
from app.domain.gpu_claims import held_elsewhere_reason
from app.domain.gpu_cordons import cordon_of, cordon_text, cordoned_indexes, unlisted_cordons
from app.domain.node_operations import find_node, replicas_matching
from app.domain.operation_results import InvalidOperation
from app.domain.state import ACTIVE_PHASES, ClusterState, GpuCordon, Node, Replica
from app.services.operations import Caller, Operations

NO_READINGS: Mapping[int, int] = MappingProxyType({})


def node_summary(state: ClusterState, node: Node, allocations: Allocations) -> NodeSummary:
    healthy = [gpu.index for gpu in node.gpus if gpu.healthy]
    held = allocations.gpus.get(node.id, {})
    cordoned = cordoned_indexes(node)
    elsewhere = allocations.held_elsewhere.get(node.id, {})
    return NodeSummary(
        id=node.id,
        address=node.address,
        connected=node.connected,
        lost=node.lost,
        cordoned=node.cordoned,
        drain_id=node.drain_id,
        labels=node.labels,
        gpus=len(node.gpus),
        healthy_gpus=len(healthy),
        free_gpus=sum(
            1
            for index in healthy
            if index not in held and index not in cordoned and index not in elsewhere
        ),
        cordoned_gpus=sorted(cordoned),
        held_elsewhere_gpus=sorted(elsewhere),
        replicas=len(_active_on(state, node.id)),
        disconnect_reason=None if node.connected else node.disconnect_reason,
    )


def node_view(
    state: ClusterState, node_id: str, memory_used_mib: Mapping[int, int] = NO_READINGS
) -> NodeView:
    """The node as the log says it, each GPU's memory in use as its latest reading says
    (``memory_used_mib``, by GPU index: what placement reads), else as its hello did."""
    node = find_node(state, node_id)
    allocations = Allocations.from_state(state)
    held = allocations.gpus.get(node.id, {})
    elsewhere = allocations.held_elsewhere.get(node.id, {})
    drain = (
        NodeDrainView(
            drain_id=node.drain_id,
            grace_s=node.drain_grace_s,
            requested_at=node.drain_requested_at,
        )
        if node.drain_id is not None
        else None
    )
    return NodeView(
        id=node.id,
        registered_at=node.registered_at,
        connection=ConnectionView(
            connected=node.connected,
            lost=node.lost,
            address=node.address,
            remote_address=node.remote_address,
            agent_version=node.agent_version,
            since=node.last_change_at,
            disconnect_reason=None if node.connected else node.disconnect_reason,
        ),
        labels=node.labels,
        port_range=list(node.port_range),
        gpus=[
            _gpu_view(
                gpu,
                held.get(gpu.index),
                memory_used_mib.get(gpu.index),
                cordon_of(node, gpu),
                elsewhere.get(gpu.index),
            )
            for gpu in node.gpus
        ],
        cordoned=node.cordoned,
        cordon_reason=node.cordon_reason,
        drain=drain,
        replicas=[
            NodeReplicaView(
                id=r.id,
                model=r.model,
                phase=r.phase.value,
                shards=[s.index for s in r.shards if s.node_id == node.id],
            )
            for r in _active_on(state, node.id)
        ],
        unlisted_gpu_cordons=[
            UnlistedGpuCordonView(
                index=cordon.index,
                uuid=cordon.uuid,
                cordon_reason=cordon.reason,
                cordoned_by=cordon.by,
            )
            for cordon in unlisted_cordons(node)
        ],
    )


def _gpu_view(
    gpu: GpuInfo,
    used_by: str | None,
    read_used_mib: int | None,
    cordon: GpuCordon | None,
    holder: str | None,
) -> GpuView:
    used = gpu.memory_used_mib if read_used_mib is None else read_used_mib
    return as_view(
        gpu,
        GpuView,
        memory_used_mib=used,
        memory_free_mib=max(gpu.memory_total_mib - used, 0),
        used_by=used_by,
        excluded_because=_exclusion_text(gpu, used_by, cordon, holder),
        cordoned=cordon is not None,
        cordon_reason=cordon.reason if cordon is not None else None,
        cordoned_by=cordon.by if cordon is not None else None,
        held_elsewhere_by=holder,
    )


def _exclusion_text(
    gpu: GpuInfo, used_by: str | None, cordon: GpuCordon | None, holder: str | None
) -> str | None:
    """Every reason placement puts no new shard on ``gpu``, in the order it checks them
    (``app.domain.placement``), joined by ``; ``: ``held elsewhere: its UUID ... is listed
    by node gpu-07 too, connected longer; unhealthy: XID 79``. Saying only the first would
    leave an operator who fixed it surprised that the GPU still takes nothing. None when
    placement may use it."""
    reasons = [
        f"held elsewhere: {held_elsewhere_reason(gpu.uuid, holder)}" if holder is not None else "",
        "" if gpu.healthy else f"unhealthy: {gpu.unhealthy_reason or 'no reason reported'}",
        cordon_text(gpu.index, cordon) if cordon is not None else "",
        f"used by replica {used_by}" if used_by is not None else "",
    ]
    return "; ".join(reason for reason in reasons if reason) or None


async def _current_view(operations: Operations, node_id: str) -> NodeView:
    state = await operations.current()
    return node_view(state, node_id, operations.gpu_memory_used(node_id))


MAX_GPU_INDEX_DIGITS = 4
"""The most digits of a GPU index a path may hold: a node lists at most 64 GPUs."""

GPU_INDEX_ECHOED = 20
"""The most characters of a path's GPU index a refusal echoes back."""


def gpu_index(text: str) -> int:
    """The GPU index a path names (``/nodes/gpu-1/gpus/3/cordon``), or the refusal saying
    what a GPU index is: ASCII digits only, so ``+3``, ``3.0`` or a fullwidth 3 name none."""
    if text.isascii() and text.isdigit() and len(text) <= MAX_GPU_INDEX_DIGITS:
        return int(text)
    shown = text if len(text) <= GPU_INDEX_ECHOED else f"{text[:GPU_INDEX_ECHOED]}…"
    raise InvalidOperation(f"{shown!r} is not a GPU index: a GPU is named by its index, such as 3")


def _active_on(state: ClusterState, node_id: str) -> list[Replica]:
    return [r for r in replicas_matching(state, node_id=node_id) if r.phase in ACTIVE_PHASES]


class NodeController(GuardedController):
    path = "/admin/v1/nodes"
    tags = ["nodes"]

    @get("/", summary="Every node the log knows")
    async def list_nodes(self, operations: NamedDependency[Operations]) -> list[NodeSummary]:
        state = await operations.current()
        allocations = Allocations.from_state(state)
        return [node_summary(state, n, allocations) for _, n in sorted(state.nodes.items())]

    @get("/{node_id:str}", summary="A node: connection, GPUs and why any is excluded, replicas")
    async def show(
        self, operations: NamedDependency[Operations], node_id: FromPath[str]
    ) -> NodeView:
        return await _current_view(operations, node_id)

    @post("/{node_id:str}/cordon", status_code=200, summary="Place nothing new on the node")
    async def cordon(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        node_id: FromPath[str],
        data: JSONBody[CordonRequest | None] = None,
    ) -> NodeChange:
        reason = data.reason if data is not None else ""
        changed = await operations.cordon(caller, node_id, reason)
        return NodeChange(changed=changed, node=await _current_view(operations, node_id))

    @post("/{node_id:str}/uncordon", status_code=200, summary="Allow placements again")
    async def uncordon(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        node_id: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> NodeChange:
        changed = await operations.uncordon(caller, node_id)
        return NodeChange(changed=changed, node=await _current_view(operations, node_id))

    @post("/{node_id:str}/forget", status_code=200, summary="Forget a retired node for good")
    async def forget(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        node_id: FromPath[str],
        data: JSONBody[ForgetRequest],
    ) -> NodeForgetting:
        revoke = data.revoke_certificates
        changed = await operations.forget_node(
            caller, node_id, data.reason, revoke_certificates=revoke
        )
        return NodeForgetting(node_id=node_id, changed=changed, certificates_revoked=revoke)

    @post(
        "/{node_id:str}/gpus/{gpu:str}/cordon",
        status_code=200,
        summary="Place no new shard on one GPU of the node",
    )
    async def cordon_gpu(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        node_id: FromPath[str],
        gpu: FromPath[str],
        data: JSONBody[CordonRequest | None] = None,
    ) -> NodeChange:
        reason = data.reason if data is not None else ""
        changed = await operations.cordon_gpu(caller, node_id, gpu_index(gpu), reason)
        return NodeChange(changed=changed, node=await _current_view(operations, node_id))

    @post(
        "/{node_id:str}/gpus/{gpu:str}/uncordon",
        status_code=200,
        summary="Allow placements on one GPU of the node again",
    )
    async def uncordon_gpu(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        node_id: FromPath[str],
        gpu: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> NodeChange:
        changed = await operations.uncordon_gpu(caller, node_id, gpu_index(gpu))
        return NodeChange(changed=changed, node=await _current_view(operations, node_id))
