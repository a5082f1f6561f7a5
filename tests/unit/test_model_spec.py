from __future__ import annotations

import re

import pytest
from msgspec.structs import replace

from app.domain.model_spec import (
    MAX_GPU_MEMORY_GIB,
    MAX_REPLICAS,
    MAX_STARTUP_TIMEOUT_S,
    MAX_STOP_GRACE_S,
    MAX_WEIGHT,
    MIN_KV_CEILING,
    MIN_WEIGHT,
    ModelSpec,
    RoutingSettings,
    validate_spec,
)

GOOD = ModelSpec(
    name="llama-70b",
    command="vllm serve meta-llama/Llama-3.1-70B --port {port} --tensor-parallel-size {gpu_count}",
    gpus_per_shard=4,
    gpu_memory_gib=70,
)


def test_a_sensible_spec_has_no_errors() -> None:
    assert validate_spec(GOOD) == []


def test_every_problem_is_named_with_its_field() -> None:
    bad = replace(
        GOOD,
        name="Llama 70B!",
        command="vllm serve {model} --port {prot}",
        gpus_per_shard=0,
        routing=RoutingSettings(kv_ceiling=1.5),
    )

    fields = {error.field: error.reason for error in validate_spec(bad)}

    assert set(fields) == {"name", "command", "gpus_per_shard", "routing.kv_ceiling"}
    assert "prot" in fields["command"]
    assert "port" in fields["command"]  # the known placeholders are listed


def test_unbalanced_braces_are_an_error_not_a_crash() -> None:
    errors = validate_spec(replace(GOOD, command="serve --port {port"))
    assert [e.field for e in errors] == ["command"]


NUMERIC_FIELDS = (
    "gpus_per_shard",
    "gpu_memory_gib",
    "shards_per_replica",
    "replicas",
    "startup_timeout_s",
    "stop_grace_s",
    "max_moves",
)
ROUTING_FIELDS = ("weight", "target_waiting", "kv_ceiling")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e308, -1e308])
@pytest.mark.parametrize("field", NUMERIC_FIELDS + tuple(f"routing.{f}" for f in ROUTING_FIELDS))
def test_every_number_is_bounded_and_the_reason_names_the_bound(field: str, value: float) -> None:
    if field.startswith("routing."):
        spec = replace(GOOD, routing=replace(GOOD.routing, **{field.split(".")[1]: value}))
    else:
        spec = replace(GOOD, **{field: value})

    [error] = validate_spec(spec)

    assert error.field == field
    assert re.fullmatch(
        r"must be (between \S+ and \S+|more than 0 and at most \S+)( \(.*\))?", error.reason
    )


@pytest.mark.parametrize(
    "spec",
    [
        replace(
            GOOD,
            gpus_per_shard=64,
            shards_per_replica=64,
            gpu_memory_gib=MAX_GPU_MEMORY_GIB,
            replicas=MAX_REPLICAS,
            startup_timeout_s=MAX_STARTUP_TIMEOUT_S,
            stop_grace_s=MAX_STOP_GRACE_S,
            max_moves=MAX_REPLICAS,
            routing=RoutingSettings(weight=MAX_WEIGHT, target_waiting=100_000, kv_ceiling=1),
        ),
        replace(
            GOOD,
            gpus_per_shard=1,
            gpu_memory_gib=0,
            replicas=0,
            startup_timeout_s=5e-324,
            stop_grace_s=0,
            max_moves=1,
            routing=RoutingSettings(weight=MIN_WEIGHT, target_waiting=1, kv_ceiling=MIN_KV_CEILING),
        ),
    ],
    ids=["every maximum", "every minimum"],
)
def test_the_bounds_themselves_are_accepted(spec: ModelSpec) -> None:
    assert validate_spec(spec) == []
