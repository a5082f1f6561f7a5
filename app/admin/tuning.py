"""``/admin/v1/models/{name}/tuning``: routing settings measured by ``llmgw-cli bench``,
applied to a model or to one of its replicas."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from app.admin.guarded import GuardedController
from app.admin.model_schemas import RoutingView
from app.domain.model_operations import find_model
from app.domain.model_spec import RoutingSettings
from app.domain.state import ClusterState
from app.services.operations import Caller, Operations


class TuningRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    replica_id: str | None = None
    """Tune this replica alone; null tunes the model (every replica without its own)."""
    weight: float
    """Share of the model's traffic, relative to its other replicas; positive."""
    target_waiting: int
    """Requests waiting in the engine at which the replica takes no new work; at least 1."""
    kv_ceiling: float
    """KV-cache usage at which the replica takes no new work; in (0, 1]."""
    summary: dict[str, Any] = {}
    """What the bench measured, kept with the settings in the log."""
    revision: int | None = None
    """The model's revision the bench measured (its replica's). Settings for the model are
    refused (422) when the model is at another revision now; null checks nothing."""


class TuningView(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when these settings were already in force (nothing was recorded)."""
    model: str
    replica_id: str | None
    routing: RoutingView
    """The settings now in force for the model, or for the replica."""


def routing_in_force(state: ClusterState, model: str, replica_id: str | None) -> RoutingView:
    routing = find_model(state, model).spec.routing
    replica = state.replicas.get(replica_id) if replica_id is not None else None
    if replica is not None and replica.routing is not None:
        routing = replica.routing
    return RoutingView(
        weight=routing.weight, target_waiting=routing.target_waiting, kv_ceiling=routing.kv_ceiling
    )


class TuningController(GuardedController):
    path = "/admin/v1/models/{name:str}/tuning"
    tags = ["models"]

    @post(
        "/",
        status_code=200,
        summary="Apply routing settings measured by bench to a model or one replica",
        description="Invalid settings are answered 422 with every field and reason; nothing "
        "is recorded then. Settings already in force record nothing.",
    )
    async def tune(
        self,
        data: JSONBody[TuningRequest],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
    ) -> TuningView:
        routing = RoutingSettings(
            weight=data.weight, target_waiting=data.target_waiting, kv_ceiling=data.kv_ceiling
        )
        changed = await operations.tune(
            caller, name, data.replica_id, routing, data.summary, data.revision
        )
        return TuningView(
            changed=changed,
            model=name,
            replica_id=data.replica_id,
            routing=routing_in_force(await operations.current(), name, data.replica_id),
        )
