"""The environment an engine starts with."""

from __future__ import annotations

from agent.engines.spec import ShardSpec, engine_env


def a_spec(**fields: object) -> ShardSpec:
    defaults: dict[str, object] = {
        "replica_id": "llama-8b-3",
        "shard_index": 0,
        "model": "llama-8b",
        "argv": ("vllm", "serve", "meta-llama/Llama-3.1-8B"),
        "gpus": (0, 1),
        "port": 20017,
    }
    return ShardSpec(**{**defaults, **fields})  # type: ignore[arg-type]


def test_the_engine_sees_its_gpus_and_port() -> None:
    env = engine_env({"PATH": "/usr/bin"}, a_spec(gpus=(0, 1), port=20017))

    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PORT"] == "20017"
    assert env["PATH"] == "/usr/bin"


def test_a_shard_without_gpus_sees_none() -> None:
    env = engine_env({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, a_spec(gpus=()))

    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_the_model_env_overrides_the_agent_env_but_not_the_assigned_gpus_or_port() -> None:
    spec = a_spec(
        env={"HF_HOME": "/models", "CUDA_VISIBLE_DEVICES": "7", "PORT": "1"},
        gpus=(2,),
        port=20100,
    )

    env = engine_env({"HF_HOME": "/root/.cache", "CUDA_VISIBLE_DEVICES": "0"}, spec)

    assert env["HF_HOME"] == "/models"
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    assert env["PORT"] == "20100"


def test_the_readiness_url_is_the_port_on_loopback() -> None:
    assert a_spec(port=20017).readiness_url == "http://127.0.0.1:20017"
