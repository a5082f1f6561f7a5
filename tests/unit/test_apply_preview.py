"""What `models apply --dry-run` says a spec would do: decided as the apply decides, so the
preview and the apply agree, and nothing is recorded."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from app.domain import model_operations as model_ops
from app.domain.apply_preview import ApplyOutcome, preview_apply
from app.domain.events import ModelDeclared, ModelTuned
from app.domain.model_spec import (
    AutoscalePolicy,
    CanaryStep,
    ModelSpec,
    RolloutPolicy,
    RoutingSettings,
)
from app.domain.operation_results import InvalidSpec
from app.domain.revisions import WITHHELD, SpecChange
from app.domain.state import ClusterState
from tests.unit.test_domain_operations import after, given

LLAMA = ModelSpec(name="llama", command="vllm serve {model} --port {port}", replicas=2)


def declared() -> ClusterState:
    return given(ModelDeclared(model="llama", spec=LLAMA))


def test_a_model_not_declared_yet_would_be_new_at_revision_1() -> None:
    preview = preview_apply(given(), LLAMA)

    assert (preview.outcome, preview.revision, preview.from_revision) == (ApplyOutcome.NEW, 1, None)


def test_the_same_spec_would_change_nothing() -> None:
    preview = preview_apply(declared(), LLAMA)

    assert (preview.outcome, preview.revision, preview.at_once) == (ApplyOutcome.UNCHANGED, 1, ())


def test_a_count_and_a_routing_setting_change_at_once_each_named() -> None:
    spec = replace(LLAMA, replicas=3, routing=RoutingSettings(weight=2.0))

    preview = preview_apply(declared(), spec)

    assert preview.outcome is ApplyOutcome.AT_ONCE
    assert (preview.revision, preview.rollout_id) == (1, None)
    assert preview.at_once == (
        SpecChange(field="replicas", old="2", new="3"),
        SpecChange(field="routing.weight", old="1", new="2"),
    )


def test_an_autoscale_policy_added_shows_each_of_its_settings_as_new() -> None:
    spec = replace(LLAMA, autoscale=AutoscalePolicy(min_replicas=1, max_replicas=4))

    preview = preview_apply(declared(), spec)

    assert SpecChange(field="autoscale.max", old=None, new="4") in preview.at_once


def test_a_list_setting_changed_is_shown_as_json_not_as_python() -> None:
    """The APIs a model serves and its canary steps are lists: the preview shows them as
    the spec and the API write them, never as Python's tuples and dicts."""
    spec = replace(
        LLAMA,
        apis=("chat",),
        rollout=RolloutPolicy(steps=(CanaryStep(replicas=1, traffic=0.05, hold_s=600),)),
    )

    preview = preview_apply(declared(), spec)

    changes = {change.field: change for change in preview.at_once}
    assert changes["apis"].new == '["chat"]'
    assert changes["apis"].old == '["chat","completions"]'
    assert changes["rollout.steps"] == SpecChange(
        field="rollout.steps", old="[]", new='[{"replicas":1,"traffic":0.05,"hold_s":600}]'
    )


def test_a_new_command_would_be_a_new_revision_with_its_rollout_and_env_values_withheld() -> None:
    spec = replace(
        LLAMA, command="vllm serve {model} --port {port} -tp 2", env={"HF_ENDPOINT": "s3"}
    )

    preview = preview_apply(declared(), spec)

    assert preview.outcome is ApplyOutcome.NEW_REVISION
    assert (preview.revision, preview.from_revision) == (2, 1)
    assert preview.rollout_id == "rollout-llama-r2"
    assert [c.field for c in preview.revision_changes] == ["command", "env.HF_ENDPOINT"]
    assert preview.revision_changes[1] == SpecChange(
        field="env.HF_ENDPOINT", old=None, new=WITHHELD
    )
    assert "s3" not in repr(preview)


def test_a_new_revision_during_a_rollout_names_the_rollout_it_would_supersede() -> None:
    state = declared()
    rolling = after(state, model_ops.apply_model(state, replace(LLAMA, command="v2 --port {port}")))

    preview = preview_apply(rolling, replace(LLAMA, command="v3 --port {port}"))
    at_once = preview_apply(rolling, replace(LLAMA, command="v2 --port {port}", replicas=3))

    assert (preview.revision, preview.from_revision) == (3, 2)
    assert (preview.rollout_id, preview.supersedes) == ("rollout-llama-r3", "rollout-llama-r2")
    assert (at_once.outcome, at_once.supersedes) == (ApplyOutcome.AT_ONCE, None)


def test_a_new_revision_with_no_rollout_under_way_supersedes_nothing() -> None:
    preview = preview_apply(declared(), replace(LLAMA, command="v2 --port {port}"))

    assert preview.supersedes is None


def test_a_removed_model_would_be_declared_again() -> None:
    state = declared()
    removed = after(state, model_ops.remove(state, "llama"))

    preview = preview_apply(removed, LLAMA)

    assert preview.outcome is ApplyOutcome.DECLARED_AGAIN


def test_re_applying_without_routing_keeps_what_bench_measured_and_says_unchanged() -> None:
    tuned = given(
        ModelDeclared(model="llama", spec=LLAMA),
        ModelTuned(model="llama", weight=3.0, target_waiting=8, kv_ceiling=0.9),
    )

    assert preview_apply(tuned, LLAMA).outcome is ApplyOutcome.UNCHANGED


def test_an_invalid_spec_is_refused_as_the_apply_refuses_it() -> None:
    with pytest.raises(InvalidSpec) as refused:
        preview_apply(declared(), replace(LLAMA, replicas=-1))

    assert [e.field for e in refused.value.errors] == ["replicas"]
