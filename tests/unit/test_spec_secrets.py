"""Secrets inline in a spec: refused, because the log keeps every spec for ever and shows it
to every operator; and what the admin API shows of one recorded before they were."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from app.domain.model_spec import ModelSpec, validate_spec
from app.domain.revisions import SpecChange, describe_changes, spec_changes

GOOD = ModelSpec(name="llama", command="llama-server -m {model} --port {port}")
KEY = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD", "APP_SECRET"]
)
def test_a_secret_named_variable_with_a_value_is_refused_saying_where_it_goes(name: str) -> None:
    errors = validate_spec(replace(GOOD, env={name: KEY, "HF_HOME": "/models"}))

    assert [(e.field, e.reason) for e in errors] == [
        (
            f"env.{name}",
            "looks like a secret, and the log keeps every spec for ever and shows it to "
            f"every operator: leave it out of the spec and set {name} in the agent's "
            "environment on the nodes (every engine inherits it)",
        )
    ]
    assert KEY not in repr(errors)


@pytest.mark.parametrize(
    "name",
    ["TOKENIZERS_PARALLELISM", "MAX_NUM_BATCHED_TOKENS", "HF_TOKEN_PATH", "SSL_KEY_FILE", "KEYS"],
)
def test_a_name_that_only_resembles_a_secret_or_says_where_one_is_is_accepted(
    name: str,
) -> None:
    assert validate_spec(replace(GOOD, env={name: "x"})) == []


@pytest.mark.parametrize(
    "command",
    [
        f"llama-server -m {{model}} --port {{port}} --api-key {KEY}",
        f"llama-server -m {{model}} --port {{port}} --api-key={KEY}",
        f"vllm serve {{model}} --port {{port}} --hf-token '{KEY}'",
        f"engine --port {{port}} --token {KEY}",
        f"engine --port {{port}} --auth-token {KEY}",
        f"engine --port {{port}} --db-password {KEY}",
    ],
)
def test_a_secret_flag_given_a_value_is_refused_naming_the_variable_to_use(command: str) -> None:
    errors = validate_spec(replace(GOOD, command=command))

    assert [e.field for e in errors] == ["command"]
    assert "set it in the agent's environment on the nodes" in errors[0].reason
    assert "LLAMA_API_KEY for llama.cpp, VLLM_API_KEY for vLLM" in errors[0].reason
    assert KEY not in errors[0].reason


@pytest.mark.parametrize(
    "command",
    [
        "llama-server -m {model} --port {port} --ssl-key-file /etc/llmgw/engine.key",
        "vllm serve {model} --port {port} --max-num-batched-tokens 8192",
        "vllm serve {model} --port {port} --hf-token --enforce-eager",
        "llmgw-sim-engine --port {port} --prefill-ms-per-token 0.5 --bos-token '<s>'",
        "engine --port {port} --tls-key /etc/engine/tls.key --key /etc/engine/other.key",
    ],
)
def test_flags_that_hold_no_secret_are_accepted(command: str) -> None:
    assert validate_spec(replace(GOOD, command=command)) == []


def test_a_revision_recorded_now_names_no_secret_an_older_command_held() -> None:
    """A spec recorded before the rule may hold one: the next revision's change of the
    command, kept in the log and shown by every history, withholds it."""
    old = replace(GOOD, command=f"llama-server --api-key {KEY} -m {{model}}")
    new = replace(GOOD, command="llama-server -m {model}")

    [change] = spec_changes(old, new)

    assert change.field == "command"
    assert change.old == "llama-server --api-key (withheld) -m {model}"


def test_a_change_an_older_release_recorded_with_a_secret_is_described_without_it() -> None:
    """Its changes were recorded as they were given: every history's summary line reads
    them."""
    change = SpecChange(
        field="command",
        old=f"llama-server --api-key {KEY} -m {{model}}",
        new="llama-server -m {model}",
    )

    said = describe_changes((change,))

    assert KEY not in said
    assert "(withheld)" in said
