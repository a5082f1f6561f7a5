"""``/admin/v1/models``: declare, scale and remove models; each one's spec and status."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Request, delete, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody

from app.admin.autoscale_schemas import AutoscaleDecisionView
from app.admin.bodies import NoBody, blank_body, duplicated_key, twice_reason
from app.admin.guarded import GuardedController
from app.admin.model_schemas import (
    ApplyPreviewView,
    ModelChange,
    ModelRolloutView,
    ModelSpecBody,
    ModelView,
    ScaleRequest,
)
from app.admin.operation_schema import body_read_by_hand
from app.admin.schemas import as_view
from app.admin.spec_display import shown_spec
from app.admin.spec_fields import meant_field
from app.admin.traffic import TrafficSource, traffic_by_revision, traffic_view
from app.domain.decision import AUTOSCALER
from app.domain.envelope import Recorded
from app.domain.events import model_stream
from app.domain.model_spec import ModelSpec, SpecError, name_errors
from app.domain.model_status import ModelStatus
from app.domain.operation_results import InvalidSpec
from app.domain.routing_settings import ROUTING_POLICIES, SESSION_KEY_SOURCES
from app.domain.state import Model
from app.services.operations import Caller, Operations
from app.store.history import read_last_scaled
from app.store.postgres import PostgresEventStore

DRY_RUN_MODEL = "dry-run"
"""The name of a dry-run spec that has none."""

_MSGSPEC_ERROR = re.compile(r"^(?P<reason>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$")
_NAMED_FIELD = re.compile(r"(?P<what>missing required|contains unknown) field `(?P<field>[^`]+)`")
_STEP_REPLICAS = re.compile(r"^rollout\.steps\[\d+\]\.replicas$")
"""A canary step's ``replicas``, whose type msgspec names as ``int | str``."""
_ITEM = re.compile(r"\[\d+\]$")
_CHOICES: dict[str, tuple[str, ...]] = {
    "routing.policy": ROUTING_POLICIES,
    "routing.session_keys": SESSION_KEY_SOURCES,
}
"""The fields whose values are names from a list, which msgspec refuses without naming it
(``Invalid enum value 'random'``): the refusal names them."""


def spec_from_body(body: bytes, path_name: str | None) -> ModelSpec:
    """The spec a request sent; ``InvalidSpec`` naming the field when it does not decode, or
    when its name differs from the one in the path. A path that names no model a spec
    could have (``Bad%20Name``) is refused for that first, as the same name in a body is,
    whatever the body holds: the body's name differing from it is not what is wrong."""
    if path_name is not None and (bad_name := name_errors(path_name)):
        raise InvalidSpec(path_name, bad_name)
    if not body.strip():
        raise InvalidSpec(path_name or "?", [SpecError("(body)", blank_body(body, optional=False))])
    try:
        sent = msgspec.json.decode(body, type=ModelSpecBody)
    except msgspec.ValidationError as exc:
        raise InvalidSpec(path_name or "?", [_spec_error(str(exc))]) from exc
    except msgspec.DecodeError as exc:
        raise InvalidSpec(path_name or "?", [SpecError("(body)", f"not JSON: {exc}")]) from exc
    twice = duplicated_key(body)
    if twice is not None:
        raise InvalidSpec(path_name or "?", [SpecError("(body)", twice_reason(twice))])
    if path_name is not None and sent.name not in (None, path_name):
        reason = f"is {sent.name!r}, but the path names {path_name!r}"
        raise InvalidSpec(path_name, [SpecError("name", reason)])
    name = path_name or sent.name or DRY_RUN_MODEL
    return msgspec.convert({**msgspec.to_builtins(sent), "name": name}, ModelSpec)


def _spec_error(message: str) -> SpecError:
    """msgspec's first complaint (``Expected `int`, got `str` - at `$.replicas```, ``Object
    contains unknown field `x```) as a field and a reason."""
    parsed = _MSGSPEC_ERROR.match(message)
    path, reason = (parsed["path"] or "", parsed["reason"]) if parsed else ("", message)
    named = _NAMED_FIELD.search(reason)
    if named is None and _STEP_REPLICAS.match(path):
        return SpecError(path, 'must be a number of replicas or "all"')
    if named is None:
        reason = reason.replace(" | null", "").lower()
        choices = _CHOICES.get(_ITEM.sub("", path))
        if choices is not None and reason.startswith("invalid enum value"):
            reason = f"{reason}; must be one of {', '.join(choices)}"
        return SpecError(path or "(body)", reason)
    field = ".".join(filter(None, (path, named["field"])))
    if named["what"] == "missing required":
        return SpecError(field, "is required")
    meant = meant_field(ModelSpecBody, path, named["field"])
    hint = f": did you mean {meant}?" if meant else ""
    return SpecError(field, f"is not a field of a model spec{hint}")


def model_view(status: ModelStatus) -> ModelView:
    model = status.model
    return as_view(
        status,
        ModelView,
        name=model.name,
        declared_at=model.declared_at,
        removed=model.removed,
        desired=model.desired,
        unplaceable_reason=model.unplaceable_reason,
        failures=model.failures,
        backoff_until=model.backoff_until,
        spec=shown_spec(msgspec.to_builtins(model.spec)),
        revision=model.revision,
        outdated=list(status.outdated),
        waiting_to_move=list(status.waiting_to_move),
        rollout=_rollout_summary(model),
    )


async def model_change(operations: Operations, name: str, changed: bool) -> ModelChange:
    """The answer to a change of model ``name``: whether it recorded anything, and the model
    as it is now."""
    return ModelChange(changed=changed, model=model_view(await operations.model(name)))


def autoscale_decision_view(recorded: Recorded) -> AutoscaleDecisionView:
    """A ``model_scaled`` as the autoscaler's decision, with what it saw."""
    return as_view(
        recorded.event,
        AutoscaleDecisionView,
        position=recorded.position,
        recorded_at=recorded.recorded_at,
    )


def _rollout_summary(model: Model) -> ModelRolloutView | None:
    rollout = model.rollout
    if rollout is None:
        return None
    return ModelRolloutView(
        rollout_id=rollout.id,
        state=rollout.state.value,
        revision=rollout.revision,
        from_revision=rollout.from_revision,
        step=rollout.step,
        steps=len(model.spec.rollout.all_steps),
        outcome=rollout.outcome,
        status=f"/admin/v1/models/{model.name}/rollout",
    )


class ModelController(GuardedController):
    path = "/admin/v1/models"
    tags = ["models"]

    @get("/", summary="Every declared model with its status")
    async def list_models(
        self, operations: NamedDependency[Operations], include_removed: FromQuery[bool] = False
    ) -> list[ModelView]:
        statuses = await operations.models(include_removed=include_removed)
        return [model_view(status) for status in statuses]

    @get(
        "/{name:str}",
        summary="A model's spec, why it is below its count if it is, its traffic by revision",
    )
    async def show(
        self,
        operations: NamedDependency[Operations],
        traffic: NamedDependency[TrafficSource],
        store: NamedDependency[PostgresEventStore],
        name: FromPath[str],
    ) -> ModelView:
        view = model_view(await operations.model(name))
        groups = traffic_by_revision(await operations.replicas(name, ended=False))
        figures = await traffic.traffic_of_groups(groups) if groups else {}
        scaled = await read_last_scaled(store.engine, model_stream(name), AUTOSCALER)
        return msgspec.structs.replace(
            view,
            traffic_by_revision={rev: traffic_view(f) for rev, f in sorted(figures.items())},
            last_autoscale=autoscale_decision_view(scaled) if scaled is not None else None,
        )

    @put(
        "/{name:str}",
        dependencies=body_read_by_hand(ModelSpecBody),
        summary="Declare a model (a JSON spec); the same spec again records nothing",
        description="An invalid spec is answered 422 with every field and reason; "
        "nothing is recorded then.",
    )
    async def apply(
        self,
        request: Request[Any, Any, Any],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
    ) -> ModelChange:
        spec = spec_from_body(await request.body(), name)
        changed = await operations.apply_model(caller, spec)
        return await model_change(operations, name, changed)

    @post(
        "/{name:str}/preview",
        status_code=200,
        dependencies=body_read_by_hand(ModelSpecBody),
        summary="What declaring a spec would do (a dry run); nothing is recorded",
        description="The same validation as PUT (422 with every field and reason), then "
        "whether the spec is new, unchanged, a change that takes effect at once, or a new "
        "revision that a rollout brings in, with every field that changes.",
    )
    async def preview(
        self,
        request: Request[Any, Any, Any],
        operations: NamedDependency[Operations],
        name: FromPath[str],
    ) -> ApplyPreviewView:
        spec = spec_from_body(await request.body(), name)
        return as_view(await operations.preview_model(spec), ApplyPreviewView)

    @post("/{name:str}/scale", status_code=200, summary="Change a model's replica count")
    async def scale(
        self,
        data: JSONBody[ScaleRequest],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
    ) -> ModelChange:
        changed = await operations.scale(caller, name, data.replicas)
        return await model_change(operations, name, changed)

    @delete(
        "/{name:str}",
        status_code=200,
        summary="Remove a model: every replica of it is stopped",
        description="Records model_removed, or nothing for a removed model (`changed` false).",
    )
    async def remove(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> ModelChange:
        changed = await operations.remove(caller, name)
        return await model_change(operations, name, changed)
