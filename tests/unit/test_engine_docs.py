"""Every model spec docs/engines.md shows is one the control plane accepts, for every engine,
with what its profile needs to be probed and scraped; the shell that the multi-node SGLang
example runs computes the arguments the page says it does."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from app.domain.commands import render_argv
from app.domain.model_spec import ModelSpec, validate_spec
from app.domain.state import ClusterState, Replica, ReplicaPhase, Shard
from wire.engines import ENGINE_NAMES, profile_of

PAGE = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)


def documented_specs() -> list[dict[str, Any]]:
    specs = [yaml.safe_load(block) for block in YAML_BLOCK.findall(PAGE.read_text())]
    assert specs, f"no yaml block in {PAGE}"
    return specs


SPECS = documented_specs()


def test_every_engine_has_a_documented_spec() -> None:
    assert {spec["engine"] for spec in SPECS} == set(ENGINE_NAMES)


@pytest.mark.parametrize("document", SPECS, ids=[spec["name"] for spec in SPECS])
def test_a_documented_spec_is_accepted(document: dict[str, Any]) -> None:
    spec = msgspec.convert(document, ModelSpec)

    assert validate_spec(spec) == []
    assert "{port}" in spec.command
    flag = profile_of(spec.engine).metrics_flag
    assert flag is None or flag in spec.command.split()


@pytest.mark.parametrize("document", SPECS, ids=[spec["name"] for spec in SPECS])
def test_a_documented_command_renders_for_every_shard(document: dict[str, Any]) -> None:
    spec = msgspec.convert(document, ModelSpec)
    for shard in placed(spec).shards:
        argv = render_argv(spec, ClusterState(), placed(spec), shard)
        assert str(shard.port) in " ".join(argv)
        assert not any("{" in word and "}" in word and "${" not in word for word in argv)


def test_the_multi_node_sglang_shell_computes_tp_and_the_rendezvous_address() -> None:
    document = next(spec for spec in SPECS if spec.get("shards_per_replica", 1) > 1)
    spec = msgspec.convert(document, ModelSpec)
    replica = placed(spec)

    launched = []
    for shard in replica.shards:
        argv = list(render_argv(spec, ClusterState(), replica, shard))
        assert argv[:2] == ["sh", "-c"]
        # Print the arguments instead of starting SGLang.
        argv[2] = argv[2].replace("python -m sglang.launch_server", "printf '%s\\n'")
        launched.append(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    total_gpus = str(spec.gpus_per_shard * spec.shards_per_replica)
    for rank, output in enumerate(launched):
        args = output.split("\n")
        assert args[args.index("--tp") + 1] == total_gpus
        assert args[args.index("--nnodes") + 1] == str(spec.shards_per_replica)
        assert args[args.index("--node-rank") + 1] == str(rank)
        assert args[args.index("--dist-init-addr") + 1] == "127.0.0.11:50000"
        assert args[args.index("--port") + 1] == str(replica.shards[rank].port)
        assert args[args.index("--served-model-name") + 1] == spec.name


def placed(spec: ModelSpec) -> Replica:
    """The spec's replica placed on nodes named by their addresses (127.0.0.11, ...)."""
    shards = tuple(
        Shard(
            index=i,
            node_id=f"127.0.0.{i + 11}",
            gpus=tuple(range(spec.gpus_per_shard)),
            port=8001 + i,
        )
        for i in range(spec.shards_per_replica)
    )
    return Replica(
        id=f"{spec.name}-1",
        model=spec.name,
        number=1,
        phase=ReplicaPhase.PLACED,
        shards=shards,
        placed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
