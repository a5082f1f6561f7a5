"""``/admin/v1/models/{name}/autoscale``: an operator turns a model's autoscaling on, sets
its whole policy (``PUT``), changes only some of its fields (``PATCH``), or turns it off. The
reconciler's autoscaler then sets the count (``app.domain.autoscale``); these record the
operator's policy, a ``model_declared`` of the same revision (no engine changes)."""

from __future__ import annotations

import msgspec
from litestar import delete, patch, put
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from app.admin.autoscale_schemas import AutoscalePolicyBody, AutoscalePolicyPatch
from app.admin.bodies import NoBody
from app.admin.guarded import GuardedController
from app.admin.model_schemas import ModelChange
from app.admin.models import model_change
from app.admin.rollouts import MODELS_PATH
from app.domain.model_spec import AutoscalePolicy
from app.services.operations import Caller, Operations


def policy_from_body(body: AutoscalePolicyBody) -> AutoscalePolicy:
    """The policy a body asks for: each field it leaves out (or sends null) at its default."""
    return msgspec.convert(msgspec.to_builtins(body), AutoscalePolicy)


def fields_from_patch(body: AutoscalePolicyPatch) -> dict[str, float | int | None]:
    """The fields a patch changes, by their names on the wire (those it leaves out absent)."""
    fields: dict[str, float | int | None] = msgspec.to_builtins(body)
    return fields


class AutoscaleController(GuardedController):
    path = MODELS_PATH
    tags = ["models"]

    @put(
        "/{name:str}/autoscale",
        summary="Autoscale a model: its count follows demand within the policy's bounds",
        description="The body is the whole policy: a field left out takes its default "
        "(min 1, max 1, target 4, capacity null, up_window_s 10, down_window_s 300, "
        "down_window_min_share 1, idle_to_zero_s 900, max_step 4, cold_start_timeout_s "
        "300). Records a model_declared of the model's revision, or nothing when the policy "
        "is the same (`changed` false). A policy out of bounds is a 422 naming each field "
        "(`autoscale.min`, ...); a removed model a 409.",
    )
    async def set_policy(
        self,
        data: JSONBody[AutoscalePolicyBody],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
    ) -> ModelChange:
        changed = await operations.set_autoscale(caller, name, policy_from_body(data))
        return await model_change(operations, name, changed)

    @patch(
        "/{name:str}/autoscale",
        summary="Change only the fields given of a model's autoscaling policy",
        description="The body names only the fields to change; the others keep the model's "
        "values (the defaults of PUT when it is not autoscaled yet, which turns it on), and a "
        "field sent as null goes back to its default (`capacity` null: no capacity). Merged "
        "on the server with the policy the change is recorded on, so that two operators "
        "changing different fields at once both keep theirs; one whose change meets "
        "another's being recorded at that instant is a 409 to send again. Records a "
        "model_declared of the model's revision, or nothing when the policy comes out the "
        "same (`changed` false). A policy out of bounds is a 422 naming each field; a "
        "removed model a 409.",
    )
    async def change_policy(
        self,
        data: JSONBody[AutoscalePolicyPatch],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
    ) -> ModelChange:
        changed = await operations.patch_autoscale(caller, name, fields_from_patch(data))
        return await model_change(operations, name, changed)

    @delete(
        "/{name:str}/autoscale",
        status_code=200,
        summary="Stop autoscaling a model: its count stays where it is, for operators to set",
        description="Records a model_declared of the model's revision without a policy, or "
        "nothing when it has none (`changed` false); a removed model is a 409.",
    )
    async def turn_off(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        name: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> ModelChange:
        changed = await operations.set_autoscale(caller, name, None)
        return await model_change(operations, name, changed)
