"""A flag the engine reads once, given twice in a spec's command, is refused when the spec is
applied: the engine would take the last one without a word."""

from __future__ import annotations

import pytest

from app.domain.engine_flags import SINGLE_FLAGS, repeated_flag_errors

LLAMA = "/opt/llama/bin/llama-server -m /models/gemma.gguf --alias {model} --metrics"


def reasons(command: str, engine: str = "llamacpp") -> list[str]:
    return [f"{e.field}: {e.reason}" for e in repeated_flag_errors(command, engine)]


def test_a_second_port_is_refused_naming_both_values() -> None:
    said = reasons(f"{LLAMA} --host 0.0.0.0 --port {{port}} --port 8080")

    assert said == [
        "command: gives --port 2 times (--port {port}, then --port 8080): the engine would "
        "take the last one without a word; give it once"
    ]


def test_every_spelling_of_a_flag_counts_with_or_without_an_equals_sign() -> None:
    said = reasons(f"{LLAMA} --host=0.0.0.0 --host 127.0.0.1 --port {{port}} --model /b.gguf")

    assert said == [
        "command: gives --host 2 times (--host 0.0.0.0, then --host 127.0.0.1): the engine "
        "would take the last one without a word; give it once",
        "command: gives --model 2 times (-m /models/gemma.gguf, then --model /b.gguf): the "
        "engine would take the last one without a word; give it once",
    ]


@pytest.mark.parametrize(
    ("engine", "command"),
    [
        ("vllm", "vllm serve org/m --port {port} --served-model-name {model} --port 9"),
        (
            "vllm",
            "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --port {port} --port 9",
        ),
        ("sglang", "python -m sglang.launch_server --model-path a --port {port} --port=9"),
    ],
)
def test_vllm_and_sglang_are_read_after_their_program(engine: str, command: str) -> None:
    assert [e.reason.split(" (")[0] for e in repeated_flag_errors(command, engine)] == [
        "gives --port 2 times"
    ]


def test_words_that_are_not_the_engines_own_are_not_read() -> None:
    # A wrapper's flags before the program, and a script given to a shell as one word.
    docker = f"docker --host unix:///run/d.sock run img {LLAMA} --host 0.0.0.0 --port {{port}}"
    shell = "sh -c 'exec llama-server --port \"$0\" --port 9' {port}"
    assert reasons(docker) == []
    assert reasons(shell) == []
    # Nothing is known of an openai server's flags.
    assert reasons(f"{LLAMA} --port {{port}} --port 9", engine="openai") == []
    assert "openai" not in SINGLE_FLAGS


def test_a_flag_given_once_or_a_command_that_cannot_be_split_says_nothing_here() -> None:
    assert reasons(f"{LLAMA} --host 0.0.0.0 --port {{port}} -np 4 -c 4096") == []
    assert reasons(f"{LLAMA} --port") == []
    assert reasons("llama-server 'unbalanced --port 1 --port 2") == []
