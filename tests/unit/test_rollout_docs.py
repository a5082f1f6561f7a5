"""The example spec of docs/rollouts.md is one the control plane accepts, every field of it
known, and applied over the running revision it starts the rollout the page describes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import yaml
from msgspec.structs import replace

from app.domain.events import ModelDeclared, RolloutStarted
from app.domain.model_operations import apply_model
from app.domain.model_spec import CanaryStep, ModelSpec, RolloutPolicy, validate_spec
from tests.unit.test_reconcile import Cluster

PAGE = Path(__file__).resolve().parents[2] / "docs" / "rollouts.md"
EXAMPLE = re.compile(r"<!-- rollout-example -->\n```yaml\n(?P<yaml>.*?)^```", re.DOTALL | re.M)


def documented_example() -> dict[str, Any]:
    found = EXAMPLE.search(PAGE.read_text())
    assert found, f"{PAGE} has no yaml block after <!-- rollout-example -->"
    document = yaml.safe_load(found["yaml"])
    assert isinstance(document, dict)
    return document


def test_the_example_spec_is_accepted_with_every_field_known() -> None:
    document = documented_example()

    spec = msgspec.convert(document, ModelSpec)

    assert validate_spec(spec) == []
    # ModelSpec itself lets an unknown field pass: a misspelt one would be dropped silently.
    assert set(document) <= set(ModelSpec.__struct_fields__)
    assert spec.rollout.steps[0] == CanaryStep(replicas=1, traffic=0.05, hold_s=900)
    assert spec.rollout != RolloutPolicy()


def test_the_example_over_the_revision_before_it_starts_a_rollout_with_its_canary() -> None:
    spec = msgspec.convert(documented_example(), ModelSpec)
    cluster = Cluster()
    before = replace(spec, command=spec.command.replace(" --enable-prefix-caching", ""))
    cluster.given(*apply_model(cluster.state, before).events)

    change = apply_model(cluster.state, spec)

    declared, started = change.events
    assert isinstance(declared, ModelDeclared)
    assert [c.field for c in declared.changes] == ["command"]
    assert isinstance(started, RolloutStarted)
    assert (started.rollout_id, started.from_revision, started.revision) == (
        "rollout-llama-3.1-70b-r2",
        1,
        2,
    )
    cluster.given(*change.events)
    assert cluster.state.models[spec.name].spec.rollout.all_steps[-1].replicas == "all"
