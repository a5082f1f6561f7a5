"""Stories of an operator's cordon of one GPU of a node: what is recorded, what the fold
keeps, and that placement puts no new shard on the GPU while a replica already there
keeps serving."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from app.domain import node_operations as node_ops
from app.domain.allocation import NOTHING_REPORTED, Allocations
from app.domain.describe import describe
from app.domain.events import (
    AnyEvent,
    GpuCordoned,
    GpuUncordoned,
    ModelDeclared,
    NodeConnected,
    ReplicaPlaced,
    ReplicaStopping,
    node_stream,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.operation_results import Change, InvalidOperation, InvalidText, UnknownNode
from app.domain.placement import Placer, explain_placement
from app.domain.state import GpuCordon
from tests.unit.test_domain_operations import after, given, gpu, node
from tests.unit.test_fold import log_of
from tests.unit.test_reconcile import of_type, placed_ids, with_two_nodes_and_a_model
from wire.messages import MAX_GPUS_PER_NODE

EIGHT = tuple(gpu(i) for i in range(8))
GPU_3 = EIGHT[3].uuid
QUAD = ModelSpec(name="llama", command="vllm serve --port {port}", gpus_per_shard=4)


def eight_gpu_node_with_gpu_3_cordoned(reason: str = "ecc errors") -> list[AnyEvent]:
    return [
        NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=EIGHT),
        GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason=reason),
    ]


# -- the operator's request --------------------------------------------------------------


def test_a_gpu_cordon_and_uncordon_are_recorded_once_each_with_the_gpus_uuid() -> None:
    state = given(*node("gpu-1", *EIGHT))

    cordoned = node_ops.cordon_gpu(state, "gpu-1", 3, "ecc errors")
    state = after(state, cordoned)
    uncordoned = node_ops.uncordon_gpu(state, "gpu-1", 3)

    assert cordoned == Change(
        stream=node_stream("gpu-1"),
        events=(GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason="ecc errors"),),
    )
    assert node_ops.cordon_gpu(state, "gpu-1", 3, "ecc errors").events == ()
    assert node_ops.cordon_gpu(state, "gpu-1", 3, "").events == (), "no reason keeps the one"
    assert node_ops.cordon_gpu(state, "gpu-1", 3, "xid 48").events == (
        GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason="xid 48"),
    )
    assert uncordoned.events == (GpuUncordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3),)
    assert node_ops.uncordon_gpu(after(state, uncordoned), "gpu-1", 3).events == ()
    assert not state.nodes["gpu-1"].cordoned, "the node itself stays uncordoned"


def test_a_gpu_the_node_does_not_have_is_refused_naming_those_it_has() -> None:
    state = given(*node("gpu-1", gpu(0), gpu(1), gpu(2)))

    for decide in (
        lambda: node_ops.cordon_gpu(state, "gpu-1", 8, "ecc errors"),
        lambda: node_ops.uncordon_gpu(state, "gpu-1", 8),
    ):
        with pytest.raises(InvalidOperation) as refused:
            decide()
        assert str(refused.value) == "node gpu-1 has no GPU 8: its GPUs are 0, 1, 2"


def test_a_cordon_of_a_gpu_pulled_out_of_the_node_can_be_lifted_though_not_made_again() -> None:
    """GPU 5 was cordoned, then pulled out of the machine: the node lists 7 GPUs. The
    cordon stays (it holds again if the GPU comes back) and the operator can lift it; a new
    cordon of GPU 5 is refused, as there is no such GPU to cordon."""
    pulled = tuple(g for g in EIGHT if g.index != 5)
    state = replay(
        log_of(
            *node("gpu-1", *EIGHT),
            GpuCordoned(node_id="gpu-1", gpu_index=5, gpu_uuid="GPU-5", reason="ecc errors"),
            NodeConnected(node_id="gpu-1", address="127.0.0.7", gpus=pulled),
            actor="alice",
        )
    )
    assert state.nodes["gpu-1"].gpu_cordons == (
        GpuCordon(index=5, uuid="GPU-5", reason="ecc errors", by="alice"),
    )

    uncordoned = node_ops.uncordon_gpu(state, "gpu-1", 5)
    with pytest.raises(InvalidOperation) as refused:
        node_ops.cordon_gpu(state, "gpu-1", 5, "ecc errors")

    assert uncordoned.events == (GpuUncordoned(node_id="gpu-1", gpu_index=5, gpu_uuid="GPU-5"),)
    assert after(state, uncordoned).nodes["gpu-1"].gpu_cordons == ()
    assert str(refused.value) == "node gpu-1 has no GPU 5: its GPUs are 0, 1, 2, 3, 4, 6, 7"
    with pytest.raises(InvalidOperation, match="node gpu-1 has no GPU 5: its GPUs are 0, 1,"):
        node_ops.uncordon_gpu(after(state, uncordoned), "gpu-1", 5)


def test_uncordoning_an_index_lifts_the_listed_gpus_cordon_before_an_unlisted_one() -> None:
    """GPU-5 was cordoned and pulled out; another GPU, GPU-new, now listed as 5, was
    cordoned too. Uncordoning 5 lifts GPU-new's first (the GPU the node lists there), then
    GPU-5's."""
    new_5 = replace(gpu(5), uuid="GPU-new")
    swapped = tuple(new_5 if g.index == 5 else g for g in EIGHT)
    state = given(
        *node("gpu-1", *EIGHT),
        GpuCordoned(node_id="gpu-1", gpu_index=5, gpu_uuid="GPU-5", reason="ecc errors"),
        NodeConnected(node_id="gpu-1", address="127.0.0.7", gpus=swapped),
        GpuCordoned(node_id="gpu-1", gpu_index=5, gpu_uuid="GPU-new", reason="burn-in"),
    )

    first = node_ops.uncordon_gpu(state, "gpu-1", 5)
    state = after(state, first)
    second = node_ops.uncordon_gpu(state, "gpu-1", 5)
    state = after(state, second)

    assert first.events == (GpuUncordoned(node_id="gpu-1", gpu_index=5, gpu_uuid="GPU-new"),)
    assert second.events == (GpuUncordoned(node_id="gpu-1", gpu_index=5, gpu_uuid="GPU-5"),)
    assert node_ops.uncordon_gpu(state, "gpu-1", 5).events == ()


def test_a_cordon_past_the_most_a_node_keeps_is_refused_until_one_is_lifted() -> None:
    """GPUs were cordoned and then swapped out, one after another, until the node kept as
    many cordons as a node may list GPUs (64), one of them of its GPU 3: another cordon is
    refused, saying which to lift, while GPU 3's may still take a new reason. Once one is
    lifted, the cordon is recorded."""
    swapped_out = [
        GpuCordoned(node_id="gpu-1", gpu_index=n % 8, gpu_uuid=f"GPU-gone-{n}", reason="ecc")
        for n in range(MAX_GPUS_PER_NODE - 1)
    ]
    state = given(
        *node("gpu-1", *EIGHT),
        *swapped_out,
        GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason="ecc errors"),
    )

    with pytest.raises(InvalidOperation) as refused:
        node_ops.cordon_gpu(state, "gpu-1", 4, "xid 48")
    new_reason = node_ops.cordon_gpu(state, "gpu-1", 3, "xid 48")
    lifted = after(state, node_ops.uncordon_gpu(state, "gpu-1", 0))

    assert str(refused.value) == (
        "GPU 4 of node gpu-1 was not cordoned: the node has 64 GPU cordons, the most it may "
        "have (64); uncordon one of the GPUs it no longer lists (0, 1, 2, 3, 4, 5, 6, 7) first"
    )
    assert new_reason.events == (
        GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason="xid 48"),
    )
    assert node_ops.cordon_gpu(lifted, "gpu-1", 4, "xid 48").events == (
        GpuCordoned(node_id="gpu-1", gpu_index=4, gpu_uuid=EIGHT[4].uuid, reason="xid 48"),
    )


def test_a_gpu_cordon_of_an_unknown_node_or_with_a_bad_reason_is_refused() -> None:
    state = given(*node("gpu-1", *EIGHT))

    with pytest.raises(UnknownNode):
        node_ops.cordon_gpu(state, "gpu-9", 3, "ecc errors")
    with pytest.raises(UnknownNode):
        node_ops.uncordon_gpu(state, "gpu-9", 3)
    with pytest.raises(InvalidText) as refused:
        node_ops.cordon_gpu(state, "gpu-1", 3, "x" * 501)
    assert [(e.field, e.reason) for e in refused.value.errors] == [
        ("reason", "at most 500 characters, not 501")
    ]


# -- the fold ----------------------------------------------------------------------------


def test_the_fold_keeps_who_cordoned_a_gpu_through_a_reconnect_and_under_another_index() -> None:
    moved = tuple(replace(g, index=7 - g.index) for g in EIGHT)  # listed the other way round
    state = replay(log_of(*eight_gpu_node_with_gpu_3_cordoned(), actor="alice"))
    cordon = GpuCordon(index=3, uuid=GPU_3, reason="ecc errors", by="alice")

    assert state.nodes["gpu-1"].gpu_cordons == (cordon,)
    replay(log_of(NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=moved)), state)
    assert state.nodes["gpu-1"].gpu_cordons == (cordon,)
    assert explain_placement(state, ModelSpec(name="m", command="x", gpus_per_shard=8)).candidates[
        0
    ].reasons == ("needs 8 healthy GPU(s), has 7: GPU 4 cordoned by alice: ecc errors",)

    replay(log_of(GpuUncordoned(node_id="gpu-1", gpu_index=4, gpu_uuid=GPU_3)), state)
    assert state.nodes["gpu-1"].gpu_cordons == ()


def test_a_gpu_cordoned_again_keeps_the_latest_reason_and_who_gave_it() -> None:
    state = replay(log_of(*eight_gpu_node_with_gpu_3_cordoned(), actor="alice"))
    replay(
        log_of(
            GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason="xid 48"),
            actor="bob",
        ),
        state,
    )

    assert state.nodes["gpu-1"].gpu_cordons == (
        GpuCordon(index=3, uuid=GPU_3, reason="xid 48", by="bob"),
    )


def test_the_history_tells_a_gpu_cordon_in_words() -> None:
    cordoned = GpuCordoned(node_id="gpu-1", gpu_index=3, gpu_uuid=GPU_3, reason="ecc errors")

    assert describe(cordoned) == f"node gpu-1 GPU 3 ({GPU_3}) cordoned: ecc errors"
    assert describe(GpuUncordoned(node_id="gpu-1", gpu_index=3)) == "node gpu-1 GPU 3 uncordoned"


# -- placement ---------------------------------------------------------------------------


def test_placement_skips_a_cordoned_gpu_and_explain_placement_names_who_cordoned_it() -> None:
    state = replay(
        log_of(*eight_gpu_node_with_gpu_3_cordoned(), ModelDeclared(model="llama", spec=QUAD))
    )

    explanation = explain_placement(state, QUAD)
    placer = Placer(state, QUAD, Allocations.for_placement(state, NOTHING_REPORTED))
    first, second = placer.place("llama-1"), placer.place("llama-2")
    needs_eight = explain_placement(state, replace(QUAD, gpus_per_shard=8))

    assert explanation.placement is not None
    assert explanation.placement[0].gpus == (0, 1, 2, 4)
    assert first is not None
    assert first[0].gpus == (0, 1, 2, 4)
    assert second is None, "GPUs 5, 6 and 7 are all that is left"
    assert needs_eight.candidates[0].reasons == (
        "needs 8 healthy GPU(s), has 7: GPU 3 cordoned by alice: ecc errors",
    )


def test_a_replica_already_on_a_cordoned_gpu_keeps_serving() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2, gpus_per_shard=8)
    cluster.reconcile()
    for replica_id in ("llama-1", "llama-2"):
        cluster.serve(replica_id)
    node_id = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(*node_ops.cordon_gpu(cluster.state, node_id, 3, "ecc errors").events)

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaStopping) == []
    assert placed_ids(decision) == []
    assert cluster.phase("llama-1").value == "serving"


def test_a_replica_decided_for_a_gpu_cordoned_meanwhile_is_placed_elsewhere() -> None:
    # Given a pass that places an eight-GPU replica on one of two nodes ...
    cluster = with_two_nodes_and_a_model(replicas=1, gpus_per_shard=8)
    stale = cluster.decided()
    [placement] = of_type(stale, ReplicaPlaced)
    node_id = placement.shards[0].node_id
    # ... when an operator cordons one of its GPUs before the pass appends ...
    cluster.given(*node_ops.cordon_gpu(cluster.state, node_id, 3, "ecc errors").events)

    # ... then the pass loses the race, and the next one places the replica on the other.
    assert cluster.appended(stale) == node_stream(node_id)
    assert placed_ids(cluster.reconcile()) == ["llama-1"]
    assert cluster.state.replicas["llama-1"].shards[0].node_id != node_id


def test_a_placement_on_other_gpus_of_the_node_is_not_overtaken_by_the_cordon() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1, gpus_per_shard=4)
    stale = cluster.decided()
    [placement] = of_type(stale, ReplicaPlaced)
    node_id = placement.shards[0].node_id
    assert placement.shards[0].gpus == (0, 1, 2, 3)
    cluster.given(*node_ops.cordon_gpu(cluster.state, node_id, 5, "ecc errors").events)

    assert cluster.appended(stale) is None
    assert cluster.state.replicas["llama-1"].shards[0].node_id == node_id
