"""A flag the engine reads once, given twice in a spec's command, is refused when the spec is
applied: the engine would take the last one without a word."""

from __future__ import annotations

import pytest

from app.domain.engine_flags import SINGLE_FLAGS, engine_flag_errors

LLAMA = "/opt/llama/bin/llama-server -m /models/gemma.gguf --alias {model} --metrics"


def reasons(command: str, engine: str = "llamacpp") -> list[str]:
    return [f"{e.field}: {e.reason}" for e in engine_flag_errors(command, engine)]


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
    assert [e.reason.split(" (")[0] for e in engine_flag_errors(command, engine)] == [
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


@pytest.mark.parametrize(
    ("engine", "command", "default"),
    [
        ("llamacpp", LLAMA, 8080),
        ("vllm", "/opt/vllm/bin/vllm serve org/m --served-model-name {model}", 8000),
        ("sglang", "python3 -m sglang.launch_server --model-path org/m", 30000),
    ],
)
def test_an_engine_given_no_port_is_refused_naming_where_it_would_listen(
    engine: str, command: str, default: int
) -> None:
    assert reasons(command, engine) == [
        f"command: gives the engine no port: it would listen on its default ({default}), "
        "where the agent never probes; add --port {port}"
    ]


def test_a_port_given_some_other_way_is_the_operators_to_know() -> None:
    # A container maps {port} to the port the engine listens on inside it; a script
    # passes it on; a fixed port is given on purpose.
    docker = "docker run -p {port}:8080 img llama-server -m /m.gguf --host 0.0.0.0"
    shell = "sh -c 'exec llama-server -m /m.gguf --port \"$0\"' {port}"
    assert reasons(docker) == []
    assert reasons(shell) == []
    assert reasons(f"{LLAMA} --port 8080") == []
    # A command that does not start the engine's program is not read.
    assert reasons("/opt/serve-gemma.sh", "llamacpp") == []
