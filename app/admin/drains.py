"""Drains: move every replica off a node (``POST /admin/v1/nodes/{id}/drain``) or one
replica (``POST /admin/v1/replicas/{id}/drain``), then follow how it goes
(``GET /admin/v1/drains/{id}``), or call it off (``POST /admin/v1/drains/{id}/cancel``).
Both drains answer at once with the drain's id; the reconciler does the moving. A node
drain's answer also says whether each replica on the node has somewhere to go now; with
``require_room`` a replica without is a 409 and nothing is recorded."""

from __future__ import annotations

from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_202_ACCEPTED
from msgspec.structs import replace

from app.admin.bodies import NoBody
from app.admin.guarded import GuardedController
from app.admin.history import event_view
from app.admin.node_schemas import DrainRequest
from app.admin.replica_schemas import (
    DrainAccepted,
    DrainChange,
    DrainProgressView,
    ReplicaRoomView,
)
from app.admin.replicas import replica_summary
from app.admin.schemas import as_view
from app.domain.drain_progress import DrainProgress
from app.domain.node_operations import NodeDrain
from app.services.operations import Caller, Operations

DRAINS_PATH = "/admin/v1/drains"


def drain_accepted(drain_id: str) -> DrainAccepted:
    return DrainAccepted(drain_id=drain_id, progress=f"{DRAINS_PATH}/{drain_id}")


def node_drain_accepted(drain: NodeDrain, grace_s: float) -> DrainAccepted:
    return replace(
        drain_accepted(drain.drain_id),
        grace_s=grace_s,
        room=[as_view(r, ReplicaRoomView) for r in drain.room],
    )


def drain_progress_view(progress: DrainProgress) -> DrainProgressView:
    return as_view(
        replace(progress, replicas=(), events=()),
        DrainProgressView,
        replicas=[replica_summary(r, progress.revisions) for r in progress.replicas],
        events=[event_view(e) for e in progress.events],
    )


class DrainController(GuardedController):
    path = "/admin/v1"

    @post(
        "/nodes/{node_id:str}/drain",
        status_code=HTTP_202_ACCEPTED,
        tags=["nodes"],
        summary=(
            "Move every replica off the node; answers at once with the drain's id and "
            "whether each replica has somewhere to go"
        ),
    )
    async def drain_node(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        node_id: FromPath[str],
        data: JSONBody[DrainRequest | None] = None,
    ) -> DrainAccepted:
        request = data or DrainRequest()
        drain = await operations.drain_node(
            caller, node_id, request.grace_s, require_room=request.require_room
        )
        return node_drain_accepted(drain, request.grace_s)

    @post(
        "/replicas/{replica_id:str}/drain",
        status_code=HTTP_202_ACCEPTED,
        tags=["replicas"],
        summary="Move a serving replica: it stops once its replacement serves",
    )
    async def drain_replica(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        replica_id: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> DrainAccepted:
        return drain_accepted(await operations.drain_replica(caller, replica_id))

    @get(
        "/drains/{drain_id:str}",
        tags=["drains"],
        summary="A drain's progress: its events, the replicas it moves",
    )
    async def progress(
        self, operations: NamedDependency[Operations], drain_id: FromPath[str]
    ) -> DrainProgressView:
        return drain_progress_view(await operations.drain(drain_id))

    @post(
        "/drains/{drain_id:str}/cancel",
        status_code=200,
        tags=["drains"],
        summary=(
            "Call a drain off: its moves under way are called off and it ends as cancelled; "
            "the node stays cordoned"
        ),
    )
    async def cancel(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        drain_id: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> DrainChange:
        changed = await operations.cancel_drain(caller, drain_id)
        return DrainChange(
            changed=changed, drain=drain_progress_view(await operations.drain(drain_id))
        )
