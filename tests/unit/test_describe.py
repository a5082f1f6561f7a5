"""Every human-readable event line names its subject, so a line of `events --follow` or of
a node's history stands on its own."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from msgspec.structs import replace

from app.domain import keys
from app.domain.autoscale_policy import AutoscalePolicy
from app.domain.describe import describe
from app.domain.events import (
    AnyEvent,
    ApiKeyCreated,
    ApiKeyRevoked,
    GpuMarkedUnhealthy,
    GpuRecovered,
    ModelDeclared,
    NodeUncordoned,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ShardPlacement,
    ShardStarting,
    ShardStopped,
)
from app.domain.model_spec import ModelSpec
from tests.support.generators import events, stream_for
from tests.unit.test_domain_operations import given as given_log


@given(events())
def test_every_line_begins_with_what_the_event_is_about(event: AnyEvent) -> None:
    kind, _, key = stream_for(event).partition("-")
    line = describe(event)
    if kind == "key" and isinstance(event, ApiKeyCreated | ApiKeyRevoked) and event.name:
        assert line.startswith(f"key {event.name} ({event.prefix}) ")
    else:
        assert line.startswith(f"{kind} {key} "), line


def test_the_lines_operators_saw_without_a_subject_now_have_one() -> None:
    assert describe(ReplicaServing(replica_id="demo-1")) == "replica demo-1 serving"
    assert describe(NodeUncordoned(node_id="dev-node-1")) == "node dev-node-1 uncordoned"
    assert describe(ApiKeyRevoked(key_id="k-1")) == "key k-1 revoked"
    starting = ShardStarting(replica_id="demo-1", shard_index=0, node_id="dev-node-1", pid=8951)
    assert describe(starting) == "replica demo-1 shard 0 starting on dev-node-1 pid 8951"


def test_a_startup_timeout_reads_as_the_replica_s_end_reason_does() -> None:
    # Before, the history said "timed out in starting after 121s (limit 120s)" and the
    # replica's end "not ready after 121s (timeout 120s)": one thing, two wordings.
    timed_out = ReplicaStartupTimedOut(replica_id="demo-1", timeout_s=120, waited_s=121)

    assert describe(timed_out) == "replica demo-1 timed out starting after 121s (limit 120s)"


def test_a_key_s_creation_says_when_it_expires_if_it_does() -> None:
    forever = ApiKeyCreated(
        key_id="k-7f3a09c2", name="ci", prefix="7f3a09c2", secret_hash="h", models=("llama",)
    )
    month = replace(forever, expires_at=datetime(2027, 1, 31, 9, 30, tzinfo=UTC))

    assert describe(forever) == "key ci (7f3a09c2) created for llama"
    assert describe(month) == (
        "key ci (7f3a09c2) created for llama, expires 2027-01-31 09:30:00 UTC"
    )


def test_a_revocation_names_the_key_as_its_creation_did() -> None:
    created = ApiKeyCreated(key_id="k-7f3a09c2", name="ci", prefix="7f3a09c2", secret_hash="h")
    state = given_log(created)

    (revoked,) = keys.revoke(state, "k-7f3a09c2").events

    assert describe(revoked) == "key ci (7f3a09c2) revoked"


def test_a_declaration_says_when_the_model_is_autoscaled_and_between_what() -> None:
    fixed = ModelSpec(name="demo", command="sim --port {port}", replicas=3)
    scaled = replace(fixed, autoscale=AutoscalePolicy(min_replicas=1, max_replicas=3))

    assert describe(ModelDeclared(model="demo", spec=fixed)) == (
        "model demo declared (revision 1): 3 replica(s) x 1 shard(s) x 1 GPU(s), engine vllm"
    )
    assert describe(ModelDeclared(model="demo", spec=scaled)) == (
        "model demo declared (revision 1): 3 replica(s) x 1 shard(s) x 1 GPU(s), engine vllm, "
        "autoscaled 1..3 replica(s)"
    )


def test_a_stop_says_who_stopped_the_shard_and_why_when_its_agent_did() -> None:
    asked = ShardStopped(replica_id="demo-1", shard_index=0, node_id="dev-node-1")
    assert describe(asked) == "replica demo-1 shard 0 stopped on dev-node-1"
    on_purpose = ShardStopped(
        replica_id="demo-1", shard_index=0, node_id="dev-node-1", reason="agent shutting down"
    )
    assert describe(on_purpose) == (
        "replica demo-1 shard 0 stopped by dev-node-1: agent shutting down"
    )


def test_a_replacement_names_its_original_once() -> None:
    placed = ReplicaPlaced(
        replica_id="demo-3",
        model="demo",
        number=3,
        shards=(ShardPlacement(index=0, node_id="dev-node-2", gpus=(1,), port=21301),),
        reason="replacement for demo-1 (drain drain-53a6dd63)",
        replaces="demo-1",
    )
    assert describe(placed) == (
        "replica demo-3 placed on dev-node-2 GPUs 1 port 21301 "
        "(replacement for demo-1 (drain drain-53a6dd63))"
    )
    unexplained = ReplicaPlaced(
        replica_id="demo-3", model="demo", number=3, shards=(), reason="moved", replaces="demo-1"
    )
    assert describe(unexplained).endswith("(moved, replacing demo-1)")


def test_a_gpu_s_health_says_which_gpu_by_its_uuid_when_the_event_names_one() -> None:
    # A driver reload may list the same GPU under another index: the UUID says which it is.
    faulty = GpuMarkedUnhealthy(
        node_id="gpu-08",
        gpu_index=1,
        gpu_uuid="GPU-84bba079-31db-9253-06a0-799dc6ebd718",
        reason="XID 79: GPU has fallen off the bus",
        xid=79,
    )
    assert describe(faulty) == (
        "node gpu-08 GPU 1 (GPU-84bba079-31db-9253-06a0-799dc6ebd718) unhealthy: "
        "XID 79: GPU has fallen off the bus"
    )
    back = GpuRecovered(
        node_id="gpu-08", gpu_index=3, gpu_uuid="GPU-84bba079-31db-9253-06a0-799dc6ebd718"
    )
    assert describe(back) == (
        "node gpu-08 GPU 3 (GPU-84bba079-31db-9253-06a0-799dc6ebd718) healthy again"
    )


def test_a_gpu_s_health_recorded_before_events_named_a_uuid_says_only_its_index() -> None:
    old_fault = GpuMarkedUnhealthy(node_id="gpu-08", gpu_index=1, reason="ECC errors")
    assert describe(old_fault) == "node gpu-08 GPU 1 unhealthy: ECC errors"
    assert (
        describe(GpuRecovered(node_id="gpu-08", gpu_index=1)) == "node gpu-08 GPU 1 healthy again"
    )
