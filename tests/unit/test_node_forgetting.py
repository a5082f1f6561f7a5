"""Stories of a node retired for good: when it may be forgotten, what the log records, what
the state keeps of it afterwards (nothing), and how its history reads."""

from __future__ import annotations

import pytest

from app.domain.describe import describe
from app.domain.events import (
    CertificateRevoked,
    GpuCordoned,
    NodeDisconnected,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeForgotten,
    NodeRegistered,
    ReplicaStopped,
    ShardFailed,
    node_stream,
    replica_stream,
)
from app.domain.node_forgetting import forget, forget_overtaken
from app.domain.node_operations import find_node
from app.domain.operation_results import Change, InvalidOperation, InvalidText, UnknownNode
from app.domain.state import revocation_key
from tests.unit.test_domain_operations import after, given, gpu, node, placed

GONE = NodeDisconnected(node_id="gpu-1", reason="agent stopped")


def test_a_disconnected_node_with_nothing_on_it_is_forgotten_with_the_reason() -> None:
    state = given(*node("gpu-1", gpu(0)), GONE)

    change = forget(state, "gpu-1", "returned to the cloud")

    assert change == Change(
        stream=node_stream("gpu-1"),
        events=(NodeForgotten(node_id="gpu-1", reason="returned to the cloud"),),
    )


def test_a_forgotten_node_leaves_the_state_with_all_it_held() -> None:
    cordon = GpuCordoned(node_id="gpu-1", gpu_index=0, gpu_uuid="GPU-0", reason="ECC")
    state = given(*node("gpu-1", gpu(0)), cordon, GONE, *node("gpu-2", gpu(0)))

    state = after(state, forget(state, "gpu-1", "rebuilt as gpu-31"))

    assert sorted(state.nodes) == ["gpu-2"]
    with pytest.raises(UnknownNode):
        forget(state, "gpu-1", "again")


def test_a_node_that_connects_after_it_was_forgotten_is_registered_anew() -> None:
    state = given(*node("gpu-1", gpu(0)), GONE)
    state = after(state, forget(state, "gpu-1", "rebuilt"))

    state = after(state, Change(stream=node_stream("gpu-1"), events=node("gpu-1", gpu(1))))

    again = find_node(state, "gpu-1")
    assert (again.connected, [g.index for g in again.gpus], again.gpu_cordons) == (True, [1], ())


def test_a_connected_node_is_refused_and_told_to_stop_its_agent() -> None:
    state = given(*node("gpu-1", gpu(0)))

    with pytest.raises(InvalidOperation) as refused:
        forget(state, "gpu-1", "retired")

    assert "it is connected" in str(refused.value)
    assert "stop its agent first, with `--engines-on-exit stop`" in str(refused.value)
    assert "nothing was recorded" in str(refused.value)


def test_a_node_with_a_replica_not_ended_is_refused_naming_the_replicas() -> None:
    state = given(*node("gpu-1", gpu(0)), placed("llama", 1, "gpu-1"), placed("qwen", 3, "gpu-1"))
    state = after(state, Change(stream=node_stream("gpu-1"), events=(GONE,)))

    with pytest.raises(InvalidOperation) as refused:
        forget(state, "gpu-1", "retired")

    message = str(refused.value)
    assert "2 replica(s) not ended have a shard on it (llama-1, qwen-3)" in message
    assert "drain it first (`llmgw-cli drain gpu-1`)" in message
    assert "connected" not in message


def test_a_node_whose_drain_is_under_way_is_refused() -> None:
    drain = NodeDrainRequested(node_id="gpu-1", drain_id="drain-7", grace_s=600)
    state = given(*node("gpu-1", gpu(0)), drain, GONE)

    with pytest.raises(InvalidOperation, match="its drain drain-7 is under way"):
        forget(state, "gpu-1", "retired")

    finished = NodeDrainFinished(node_id="gpu-1", drain_id="drain-7", outcome="done")
    assert forget(after(state, Change(stream="s", events=(finished,))), "gpu-1", "retired").events


def test_replicas_that_ended_on_the_node_do_not_keep_it_and_keep_their_history() -> None:
    failed = ShardFailed(replica_id="llama-1", shard_index=0, node_id="gpu-1", error="oom")
    state = given(
        *node("gpu-1", gpu(0)),
        placed("llama", 1, "gpu-1"),
        failed,
        ReplicaStopped(replica_id="llama-1"),
        GONE,
    )

    state = after(state, forget(state, "gpu-1", "retired"))

    assert state.replicas["llama-1"].shards[0].node_id == "gpu-1"
    assert "gpu-1" not in state.nodes


def test_an_unknown_node_is_refused_as_unknown() -> None:
    with pytest.raises(UnknownNode, match="no node 'gpu-9' is known"):
        forget(given(*node("gpu-1", gpu(0))), "gpu-9", "retired")


@pytest.mark.parametrize("reason", ["", "   ", "two\nlines", "x" * 501])
def test_a_missing_or_unrecordable_reason_is_refused(reason: str) -> None:
    state = given(*node("gpu-1", gpu(0)), GONE)

    with pytest.raises(InvalidText, match="reason"):
        forget(state, "gpu-1", reason)


def test_the_certificates_can_be_revoked_in_the_same_change() -> None:
    state = given(*node("gpu-1", gpu(0)), GONE)

    change = forget(state, "gpu-1", "stolen", revoke_certificates=True)

    assert change.events == (
        CertificateRevoked(node_id="gpu-1", reason="stolen"),
        NodeForgotten(node_id="gpu-1", reason="stolen"),
    )
    state = after(state, change)
    assert "gpu-1" not in state.nodes
    assert revocation_key(None, "gpu-1") in state.revocations


def test_a_forget_is_overtaken_by_a_replica_placed_on_the_node_meanwhile() -> None:
    state = given(*node("gpu-1", gpu(0)), GONE)
    change = forget(state, "gpu-1", "retired")

    assert forget_overtaken(change, after(state, change)) is None
    placed_meanwhile = Change(stream="s", events=(placed("llama", 1, "gpu-1"),))
    overtaken = after(after(state, placed_meanwhile), change)
    assert forget_overtaken(change, overtaken) == replica_stream("llama-1")


def test_the_history_says_the_node_was_forgotten_and_why() -> None:
    line = describe(NodeForgotten(node_id="gpu-1", reason="returned to the cloud"))

    assert line == "node gpu-1 forgotten for good: returned to the cloud"


def test_a_registration_alone_is_not_connected_and_can_be_forgotten() -> None:
    state = given(NodeRegistered(node_id="gpu-1", address="127.0.0.7"))

    assert forget(state, "gpu-1", "never came up").events
