"""What one shard of a model takes of every hello its node sends, measured before the model
is declared.

A node's hello lists every shard it runs, and must fit one message however many it runs:
each shard has ``MAX_SHARD_REPORT_BYTES`` of it, as JSON, and the agent refuses to start a
shard whose report could take more (``agent.reports``). The report carries the replica id
and the model's name, so a model whose name is too long for the budget would be placed and
then fail every start. Here the control plane measures the report at its longest (the
longest replica id it can generate for the model, the highest indexes, pid and port) so it
refuses such a model before it is declared.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec

MAX_SHARD_REPORT_BYTES = 768
"""A copy of ``wire.messages.MAX_SHARD_REPORT_BYTES`` (the domain imports no ``wire``), kept
equal to it by a test."""
MAX_REPLICA_NUMBER = 2**31 - 1
"""The highest ``n`` of a replica id ``<model>-<n>`` (``events.replica_id_for``): how many
replicas a model has had is kept in an integer column, which holds no more."""
MAX_REPORTED_GPU_INDEX = 4095
"""The highest GPU index an agent may report (``wire.messages.GpuIndex``, kept equal by a
test): a shard's GPUs are among those its node reported."""
_LONGEST_PORT = 65_535
_LONGEST_PID = 2**31 - 1
"""``wire.messages.MAX_PID``."""
_LONGEST_STATE = "starting"
_LONGEST_START = datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=-12)))


class _ShardReport(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The fields of ``wire.messages.ShardReport`` in its order (a test keeps the two equal
    in size for the same values). A running shard's report carries no ``failure``; the
    agent cuts a failed one's to fit the same budget."""

    replica_id: str
    shard_index: int
    model: str
    port: int
    gpus: tuple[int, ...]
    pid: int
    state: str
    started_at: datetime
    failure: str | None = None


def longest_replica_id(model: str) -> str:
    """The longest replica id the control plane can generate for ``model``."""
    return f"{model}-{MAX_REPLICA_NUMBER}"


def longest_shard_report_bytes(model: str, gpus_per_shard: int, shards_per_replica: int) -> int:
    """The most bytes of JSON one shard of such a model can take in its node's hello."""
    report = _ShardReport(
        replica_id=longest_replica_id(model),
        shard_index=max(shards_per_replica - 1, 0),
        model=model,
        port=_LONGEST_PORT,
        gpus=(MAX_REPORTED_GPU_INDEX,) * gpus_per_shard,
        pid=_LONGEST_PID,
        state=_LONGEST_STATE,
        started_at=_LONGEST_START,
    )
    return len(msgspec.json.encode(report))


def longest_model_name(
    gpus_per_shard: int, shards_per_replica: int, budget: int = MAX_SHARD_REPORT_BYTES
) -> int:
    """How many characters a model's name may have (each one byte of JSON, as a name's
    characters are) for its shards' reports to stay within ``budget``; 0 when none fits."""
    empty = longest_shard_report_bytes("", gpus_per_shard, shards_per_replica)
    # The name is in the report twice: as the model and at the head of the replica id.
    return max((budget - empty) // 2, 0)


def shard_report_refusal(
    model: str, gpus_per_shard: int, shards_per_replica: int, budget: int = MAX_SHARD_REPORT_BYTES
) -> str | None:
    """Why an agent would refuse every start of such a model's shards, or None."""
    size = longest_shard_report_bytes(model, gpus_per_shard, shards_per_replica)
    if size <= budget:
        return None
    most = longest_model_name(gpus_per_shard, shards_per_replica, budget)
    return (
        f"is too long: with replica ids up to {longest_replica_id(model)[len(model) :]!r} "
        f"after it, each shard would take up to {size} bytes of every hello of its node, "
        f"more than the {budget} an agent allows a shard (so it would refuse every start); "
        f"with {gpus_per_shard} GPU(s) per shard a name may have at most {most} characters"
    )
