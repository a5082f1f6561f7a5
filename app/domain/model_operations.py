"""What an operator asks of a model: declare, scale, autoscale, remove, and where it would
be placed. Pure decisions, no I/O.

Each returns the ``Change`` to record on the model's stream, none when the request changes
nothing, or raises an ``OperationError`` (``app.domain.operation_results``). The model's
rollouts are steered in ``rollout_operations``; how a model is doing is ``model_status``.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from msgspec.structs import replace

from app.domain.allocation import NOTHING_REPORTED
from app.domain.events import (
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    RolloutFinished,
    RolloutStarted,
    model_stream,
)
from app.domain.model_spec import (
    AutoscalePolicy,
    ModelSpec,
    RoutingSettings,
    held_step_count_errors,
    validate_spec,
)
from app.domain.operation_results import (
    Change,
    InvalidOperation,
    InvalidSpec,
    UnknownModel,
    find_known,
)
from app.domain.placement import Explanation, explain_placement
from app.domain.reports import NodeReport
from app.domain.revisions import FIRST_REVISION, next_revision, rollout_id_for, spec_changes
from app.domain.spec_error import SpecError
from app.domain.state import ClusterState, Model


def apply_model(state: ClusterState, spec: ModelSpec) -> Change:
    """Declare ``spec``: nothing when the model is already declared exactly so.

    A spec that says nothing about routing (the defaults) keeps the routing the model has:
    re-applying the file a model was declared from must not undo what ``bench`` measured
    and recorded as ``ModelTuned``. Routing written in the spec replaces it.

    The first declaration is revision 1; a spec that changes what runs (``REVISION_FIELDS``)
    is the next revision, with what changed; any other change keeps the revision and takes
    effect at once. A model removed and declared again continues its count of revisions,
    compared with the spec it had when it was removed; a rollout it still had under way
    ends first, as a pass would have ended it."""
    errors = validate_spec(spec)
    known = state.models.get(spec.name)
    if errors:
        raise InvalidSpec(spec.name, errors, _older_spec_note(known, errors))
    if known is None:
        declared = ModelDeclared(model=spec.name, spec=spec, revision=FIRST_REVISION)
        return Change(stream=model_stream(spec.name), events=(declared,))
    if not known.removed and spec.routing == RoutingSettings():
        spec = replace(spec, routing=known.spec.routing)
    if not known.removed and spec.autoscale is not None and known.spec.autoscale is not None:
        # The autoscaler owns the count: re-applying the file must not reset it.
        spec = replace(spec, replicas=known.spec.replicas)
    if not known.removed and known.spec == spec:
        return Change(stream=model_stream(spec.name))
    changes = spec_changes(known.spec, spec)
    revision = next_revision(max(known.revision, known.latest_revision), changes)
    if not changes:
        revision = known.revision
    declared = ModelDeclared(model=spec.name, spec=spec, revision=revision, changes=changes)
    if known.removed:
        return Change(stream=model_stream(spec.name), events=(*_ended(known), declared))
    if revision == known.revision:
        return Change(stream=model_stream(spec.name), events=(declared,))
    started = RolloutStarted(
        model=spec.name,
        rollout_id=rollout_id_for(spec.name, revision),
        revision=revision,
        from_revision=known.revision,
    )
    return Change(
        stream=model_stream(spec.name),
        events=(declared, started),
        correlation_id=started.rollout_id,
    )


def _older_spec_note(known: Model | None, errors: list[SpecError]) -> str:
    """What the operator of a model whose recorded spec breaks the same rules should know:
    a spec an older release accepted (a secret inline, a flag given twice) that today's
    rules refuse, even re-applied with only its count changed."""
    if known is None or known.removed:
        return ""
    recorded = validate_spec(known.spec)
    if not any(error in recorded for error in errors):
        return ""
    return (
        f"Model {known.name} runs a spec recorded before these rules, which stays in use "
        "until a spec that meets them is applied; meanwhile its count is changed by "
        f"`llmgw-cli scale {known.name} N` (or `llmgw-cli autoscale {known.name}` when it "
        "is autoscaled)"
    )


def _ended(removed: Model) -> tuple[RolloutFinished, ...]:
    """The end of the rollout a removed model still has under way, as the reconciler's next
    pass would record it: declared again first, the model would carry that rollout on into
    its new revision."""
    rollout = removed.rollout
    if rollout is None or not rollout.under_way:
        return ()
    finished = RolloutFinished(
        model=removed.name,
        rollout_id=rollout.id,
        succeeded=False,
        outcome="the model was removed",  # the words of ``rollout.rollout_moves``
    )
    return (finished,)


def scale(state: ClusterState, name: str, replicas: int) -> Change:
    model = declared_model(state, name)
    policy = model.spec.autoscale
    if policy is not None:
        raise InvalidOperation(
            f"model {name} is autoscaled between {policy.min_replicas} and "
            f"{policy.max_replicas} replicas; change the bounds (llmgw-cli autoscale {name} "
            "--min N --max N) or turn autoscaling off (--off) first"
        )
    errors = [
        e for e in validate_spec(replace(model.spec, replicas=replicas)) if e.field == "replicas"
    ]
    if errors:
        raise InvalidSpec(name, errors)
    if replicas == model.spec.replicas:
        return Change(stream=model_stream(name))
    scaled = ModelScaled(model=name, replicas=replicas, previous=model.spec.replicas)
    return Change(stream=model_stream(name), events=(scaled,))


def set_autoscale(state: ClusterState, name: str, policy: AutoscalePolicy | None) -> Change:
    """Turn autoscaling on with ``policy`` (or change it), or off with None: the count stays
    what it is until the autoscaler changes it (or an operator does, once it is off). Not
    a revision: it changes no engine.

    Only what the change itself gets wrong is refused: a spec recorded by an older release
    that today's rules refuse (a secret inline, a flag given twice) stays in use until a
    spec is applied, and its count must stay in an operator's hands meanwhile, as ``scale``
    keeps it for a model that is not autoscaled."""
    model = declared_model(state, name)
    spec = replace(model.spec, autoscale=policy)
    recorded = validate_spec(model.spec)
    errors = [e for e in validate_spec(spec) if e not in recorded]
    if policy is None:
        # Off, the count is what the autoscaler left, and a held step may bring up as many
        # replicas as that: ``scale`` to that count is accepted (the step's hold pauses
        # instead), so turning it off must be too, or nothing could turn it off.
        errors = [e for e in errors if e not in held_step_count_errors(spec)]
    if errors:
        raise InvalidSpec(name, errors)
    if spec == model.spec:
        return Change(stream=model_stream(name))
    declared = ModelDeclared(model=name, spec=spec, revision=model.revision)
    return Change(stream=model_stream(name), events=(declared,))


def patch_autoscale(
    state: ClusterState, name: str, fields: Mapping[str, float | int | None]
) -> Change:
    """Change only ``fields`` of the model's policy (named as the policy is on the wire,
    ``min``, ``max``, ...), the others kept as the model has them, or at their defaults when
    it is not autoscaled yet; a field given as None goes back to its default. Merged here,
    on the state the change is appended on, so that two operators changing different fields
    at once both keep their change."""
    model = declared_model(state, name)
    merged = msgspec.to_builtins(model.spec.autoscale or AutoscalePolicy())
    for field, value in fields.items():
        if value is None:
            merged.pop(field, None)
        else:
            merged[field] = value
    policy = msgspec.convert(merged, AutoscalePolicy)
    if "min" in fields and "max" not in fields and policy.min_replicas > policy.max_replicas:
        # The max it is above is the model's, which this change did not name: "max must be
        # at least min" would point at a field the operator never typed.
        raise InvalidSpec(
            name,
            [
                SpecError(
                    "autoscale.min",
                    f"{policy.min_replicas} is above the model's max ({policy.max_replicas}), "
                    "which this change keeps: change max with it",
                )
            ],
        )
    return set_autoscale(state, name, policy)


def remove(state: ClusterState, name: str) -> Change:
    """Every replica of a removed model is stopped by the reconciler."""
    model = find_model(state, name)
    if model.removed:
        return Change(stream=model_stream(name))
    return Change(stream=model_stream(name), events=(ModelRemoved(model=name),))


def placement_of(
    state: ClusterState, name: str, running: Mapping[str, NodeReport] = NOTHING_REPORTED
) -> Explanation:
    """Where the reconciler would place one more replica of the model now: ``running`` is
    what each connected node reports running (``Allocations.for_placement``)."""
    return explain_placement(state, find_model(state, name).spec, running=running)


def placement_dry_run(
    state: ClusterState, spec: ModelSpec, running: Mapping[str, NodeReport] = NOTHING_REPORTED
) -> Explanation:
    errors = validate_spec(spec)
    if errors:
        raise InvalidSpec(spec.name, errors)
    return explain_placement(state, spec, running=running)


# -- lookups -----------------------------------------------------------------------------


def find_model(state: ClusterState, name: str) -> Model:
    return find_known(state.models, name, UnknownModel)


def declared_model(state: ClusterState, name: str) -> Model:
    model = find_model(state, name)
    if model.removed:
        raise InvalidOperation(f"model {name} was removed; apply its spec to declare it again")
    return model
