"""Replicas of several shards whose agents stopped some of their engines on purpose: the
stopped shard is started again alone only if nothing of its replica kept running; a
replica whose other shards ran on meanwhile is replaced whole once the node is back."""

from __future__ import annotations

from app.domain.events import NodeConnected, NodeDisconnected, ReplicaStopping, ShardStopped
from app.domain.reports import NodeReport
from app.domain.state import ReplicaPhase
from tests.unit.test_reconcile import Cluster, commands, gpus, of_type, placed_ids

SHUTDOWN = "agent shutting down"


def two_shard_replica_serving() -> Cluster:
    """llama-1, of two shards, serving on gpu-1 (shard 0) and gpu-2 (shard 1)."""
    cluster = Cluster()
    for node in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"):
        cluster.node(node, n_gpus=1)
    cluster.model(replicas=1, shards_per_replica=2)
    cluster.after(31)  # past the adoption grace
    cluster.reconcile()
    cluster.serve("llama-1")
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    return cluster


def agent_stops_its_shard_and_leaves(cluster: Cluster, node: str, index: int) -> None:
    cluster.given(
        ShardStopped(replica_id="llama-1", shard_index=index, node_id=node, reason=SHUTDOWN)
    )
    cluster.gone(node)
    cluster.given(NodeDisconnected(node_id=node, reason="closed 1001"))


def back(cluster: Cluster, node: str) -> None:
    cluster.given(NodeConnected(node_id=node, address="127.0.0.9", gpus=gpus(1, node)))
    cluster.reports[node] = NodeReport(node_id=node)  # its engine is gone
    cluster.after(1)


def shard_node(cluster: Cluster, index: int) -> str:
    return cluster.state.replicas["llama-1"].shards[index].node_id


def test_a_shard_stopped_by_its_agent_while_its_peers_ran_on_replaces_the_whole_replica() -> None:
    cluster = two_shard_replica_serving()
    stopped, peer = shard_node(cluster, 1), shard_node(cluster, 0)
    agent_stops_its_shard_and_leaves(cluster, stopped, 1)
    assert cluster.reconcile().events == (), "it waits for its node, out of routing"

    back(cluster, stopped)
    decision = cluster.reconcile()

    assert "start-llama-1-1" not in commands(decision), "a rank alone cannot rejoin its peers"
    (stopping,) = of_type(decision, ReplicaStopping)
    assert stopping.replica_id == "llama-1"
    assert f"shard 1 stopped by {stopped}" in stopping.reason
    assert f"shard 0 kept running on {peer}" in stopping.reason
    assert "stop-llama-1-0" in commands(decision)
    assert placed_ids(decision) == ["llama-2"]


def test_a_replica_whose_every_shard_its_agents_stopped_starts_again_whole() -> None:
    cluster = two_shard_replica_serving()
    first, second = shard_node(cluster, 0), shard_node(cluster, 1)
    agent_stops_its_shard_and_leaves(cluster, first, 0)
    agent_stops_its_shard_and_leaves(cluster, second, 1)

    back(cluster, first)
    assert commands(cluster.reconcile()) == ["start-llama-1-0"]
    back(cluster, second)
    decision = cluster.reconcile()

    assert of_type(decision, ReplicaStopping) == []
    assert commands(decision) == ["start-llama-1-0", "start-llama-1-1"]
    assert placed_ids(decision) == []
