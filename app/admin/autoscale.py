"""``/admin/v1/models/{name}/autoscale``: an operator turns a model's autoscaling on, changes
its policy, or turns it off. The reconciler's autoscaler then sets the count
(``app.domain.autoscale``); these record the operator's policy, a ``model_declared`` of the
same revision (no engine changes)."""

from __future__ import annotations

import msgspec
from litestar import Controller, delete, put
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from app.admin.auth import require_actor
from app.admin.autoscale_schemas import AutoscalePolicyBody
from app.admin.bodies import check_body
from app.admin.model_schemas import ModelChange
from app.admin.models import model_view
from app.admin.rollouts import MODELS_PATH
from app.domain.model_spec import AutoscalePolicy
from app.services.operations import Caller, Operations


def policy_from_body(body: AutoscalePolicyBody) -> AutoscalePolicy:
    """The policy a body asks for: each field it leaves out (or sends null) at its default."""
    return msgspec.convert(msgspec.to_builtins(body), AutoscalePolicy)


class AutoscaleController(Controller):
    path = MODELS_PATH
    guards = [require_actor, check_body]
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
        return ModelChange(changed=changed, model=model_view(await operations.model(name)))

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
    ) -> ModelChange:
        changed = await operations.set_autoscale(caller, name, None)
        return ModelChange(changed=changed, model=model_view(await operations.model(name)))
