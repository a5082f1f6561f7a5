"""A model is declared only if every shard the control plane can start of it fits the share
of its node's hello an agent allows a shard: otherwise it would be placed, and every start
refused by the agent."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from msgspec.structs import replace

from agent.reports import _LONGEST_PID, _LONGEST_START, _LONGEST_STATE, json_bytes
from agent.reports import shard_report_refusal as agent_refusal
from app.domain import model_spec
from app.domain.commands import start_command
from app.domain.events import replica_id_for
from app.domain.model_spec import (
    MAX_GPUS_PER_SHARD,
    MAX_SHARDS_PER_REPLICA,
    ModelSpec,
    validate_spec,
)
from app.domain.shard_report_budget import (
    MAX_REPLICA_NUMBER,
    MAX_REPORTED_GPU_INDEX,
    MAX_SHARD_REPORT_BYTES,
    _ShardReport,
    longest_model_name,
    longest_replica_id,
    longest_shard_report_bytes,
    shard_report_refusal,
)
from app.domain.state import ClusterState, Replica, ReplicaPhase, Shard
from app.hub.edge import command_to_wire
from wire.messages import MAX_LISTED, ShardReport, StartShard
from wire.messages import MAX_SHARD_REPORT_BYTES as WIRE_MAX_SHARD_REPORT_BYTES

LONGEST_NAME = "m" * 63
"""The longest name ``NAME_PATTERN`` accepts."""


def widest_spec(name: str = LONGEST_NAME) -> ModelSpec:
    return ModelSpec(
        name=name,
        command="engine --model {model} --port {port}",
        gpus_per_shard=MAX_GPUS_PER_SHARD,
        shards_per_replica=MAX_SHARDS_PER_REPLICA,
    )


def agents_measure(spec: ModelSpec) -> int:
    """The bytes the agent measures (with its own longest pid, state and start time) for
    the last shard of the model's longest replica id, on the highest GPU indexes."""
    report = ShardReport(
        replica_id=longest_replica_id(spec.name),
        shard_index=spec.shards_per_replica - 1,
        model=spec.name,
        port=65535,
        gpus=(MAX_LISTED - 1,) * spec.gpus_per_shard,
        pid=_LONGEST_PID,
        state=_LONGEST_STATE,
        started_at=_LONGEST_START,
    )
    return json_bytes(report)


def test_the_budget_and_bounds_are_the_wires() -> None:
    """The domain imports no ``wire``: its copies are kept equal here."""
    assert MAX_SHARD_REPORT_BYTES == WIRE_MAX_SHARD_REPORT_BYTES
    assert MAX_REPORTED_GPU_INDEX == MAX_LISTED - 1
    assert [f.encode_name for f in msgspec.structs.fields(_ShardReport)] == [
        f.encode_name for f in msgspec.structs.fields(ShardReport)
    ]


def test_the_longest_replica_id_is_the_one_reconcile_generates_with_the_highest_number() -> None:
    assert longest_replica_id("m") == replica_id_for("m", MAX_REPLICA_NUMBER)
    assert MAX_REPLICA_NUMBER == 2**31 - 1  # the projection's integer column


@pytest.mark.parametrize("gpus", [1, 8, MAX_GPUS_PER_SHARD])
def test_the_control_plane_measures_a_shard_as_the_agent_does(gpus: int) -> None:
    spec = replace(widest_spec(), gpus_per_shard=gpus)
    domain = longest_shard_report_bytes(spec.name, spec.gpus_per_shard, spec.shards_per_replica)
    assert domain == agents_measure(spec)


def test_the_widest_model_the_control_plane_accepts_is_one_the_agent_starts() -> None:
    spec = widest_spec()
    assert validate_spec(spec) == []
    last = MAX_SHARDS_PER_REPLICA - 1
    shard = Shard(
        index=last,
        node_id="n1",
        gpus=tuple(range(MAX_LISTED - MAX_GPUS_PER_SHARD, MAX_LISTED)),
        port=65535,
    )
    replica = Replica(
        id=longest_replica_id(spec.name),
        model=spec.name,
        number=MAX_REPLICA_NUMBER,
        phase=ReplicaPhase.PLACED,
        shards=(shard,),
        placed_at=datetime.now(UTC),
    )
    command = command_to_wire(start_command(ClusterState(), spec, replica, shard))
    assert isinstance(command, StartShard)
    assert agent_refusal(command) is None


@pytest.mark.parametrize("gpus", [1, 8, MAX_GPUS_PER_SHARD])
def test_a_name_at_the_derived_bound_fits_and_one_character_more_does_not(gpus: int) -> None:
    # A budget smaller than the wire's, so that the bound falls within NAME_PATTERN's.
    budget = longest_shard_report_bytes("m" * 40, gpus, MAX_SHARDS_PER_REPLICA) + 1
    most = longest_model_name(gpus, MAX_SHARDS_PER_REPLICA, budget)
    assert most == 40
    at_limit, over = "m" * most, "m" * (most + 1)
    assert longest_shard_report_bytes(at_limit, gpus, MAX_SHARDS_PER_REPLICA) <= budget
    assert shard_report_refusal(at_limit, gpus, MAX_SHARDS_PER_REPLICA, budget) is None
    refusal = shard_report_refusal(over, gpus, MAX_SHARDS_PER_REPLICA, budget)
    assert refusal is not None
    assert f"more than the {budget} an agent allows a shard" in refusal
    assert f"at most {most} characters" in refusal


def test_with_the_wires_budget_every_name_the_pattern_accepts_fits() -> None:
    assert longest_model_name(MAX_GPUS_PER_SHARD, MAX_SHARDS_PER_REPLICA) >= len(LONGEST_NAME)


def test_a_spec_whose_shards_would_not_fit_is_refused_naming_the_name_and_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = widest_spec()
    size = longest_shard_report_bytes(spec.name, spec.gpus_per_shard, spec.shards_per_replica)
    monkeypatch.setattr(model_spec, "MAX_SHARD_REPORT_BYTES", size)
    assert validate_spec(spec) == []
    monkeypatch.setattr(model_spec, "MAX_SHARD_REPORT_BYTES", size - 1)
    [error] = validate_spec(spec)
    assert error.field == "name"
    assert f"up to {size} bytes of every hello" in error.reason
    assert f"more than the {size - 1} an agent allows a shard" in error.reason
