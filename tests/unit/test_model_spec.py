from __future__ import annotations

from msgspec.structs import replace

from app.domain.model_spec import ModelSpec, RoutingSettings, validate_spec

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
