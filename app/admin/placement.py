"""Where a replica would be placed, and why every other node would not: for a declared model,
or for a spec that is only being tried (nothing is recorded)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from app.admin.guarded import GuardedController
from app.admin.model_schemas import ModelSpecBody
from app.admin.models import spec_from_body
from app.admin.node_schemas import PlacementView
from app.admin.operation_schema import body_read_by_hand
from app.admin.schemas import as_view
from app.domain.placement import Explanation
from app.services.operations import Operations


def placement_view(explanation: Explanation) -> PlacementView:
    return as_view(explanation, PlacementView, placeable=explanation.placement is not None)


class PlacementController(GuardedController):
    path = "/admin/v1"
    tags = ["placement"]

    @get("/models/{name:str}/placement", summary="Explain where one more replica would go")
    async def of_model(
        self, operations: NamedDependency[Operations], name: FromPath[str]
    ) -> PlacementView:
        return placement_view(await operations.placement(name))

    @post(
        "/placement",
        status_code=200,
        dependencies=body_read_by_hand(ModelSpecBody),
        summary="Explain where a spec would go (a dry run)",
    )
    async def dry_run(
        self, request: Request[Any, Any, Any], operations: NamedDependency[Operations]
    ) -> PlacementView:
        spec = spec_from_body(await request.body(), None)
        return placement_view(await operations.placement_dry_run(spec))
