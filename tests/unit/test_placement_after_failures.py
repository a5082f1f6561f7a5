"""A replica that failed on a node is placed next on a node where the model failed fewer
times, so a node that cannot run the model (its file missing there, say) does not take
every attempt while another node has room; once a replica serves, the count starts over."""

from __future__ import annotations

from app.domain.events import ReplicaPlaced, ShardFailed
from app.domain.placement import explain_placement
from tests.unit.test_reconcile import Cluster, of_type


def fail(cluster: Cluster, replica_id: str) -> None:
    """Its one shard exits, as llama.cpp does on a model file its node lacks."""
    node_id = cluster.state.replicas[replica_id].shards[0].node_id
    cluster.given(
        ShardFailed(
            replica_id=replica_id,
            shard_index=0,
            node_id=node_id,
            error="engine exited with code 1: model file not found",
        )
    )
    cluster.reconcile()  # records replica_failed; the model backs off
    cluster.after(700)  # past any backoff


def placed_on(cluster: Cluster) -> list[str]:
    placed = of_type(cluster.reconcile(), ReplicaPlaced)
    return [e.shards[0].node_id for e in placed if e.model == "llama"]


def test_the_next_replica_goes_to_the_node_the_model_failed_on_least() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.node("gpu-2", n_gpus=4)
    cluster.model("other", replicas=1)
    cluster.model("llama", replicas=1)
    cluster.after(31)
    # gpu-1 is the tightest fit once "other" holds one of its GPUs: llama goes there first.
    cluster.reconcile()
    cluster.serve("other-1")
    assert cluster.state.replicas["llama-1"].shards[0].node_id == "gpu-1"

    fail(cluster, "llama-1")
    assert placed_on(cluster) == ["gpu-2"]

    fail(cluster, "llama-2")
    # Each node failed once: fit and node id decide again.
    assert placed_on(cluster) == ["gpu-1"]
    fail(cluster, "llama-3")
    summary = explain_placement(cluster.state, cluster.state.models["llama"].spec).summary
    assert summary.startswith("would place on gpu-2 (GPUs 0, port 20000"), summary
    assert "1 failed there since one served)" in summary, summary
    assert "ranked by fewest failures of this model since one served" in summary, summary
    assert placed_on(cluster) == ["gpu-2"]

    cluster.serve("llama-4")
    assert cluster.state.models["llama"].failed_on == {}
