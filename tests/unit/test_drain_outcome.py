"""Stories of what a node drain's outcome (``node_drain_finished``, what ``llmgw-cli drain
--wait`` prints and exits by) says of the replicas that served on the node when it began:
each moved, or it names the one that did not and why, whoever stopped it."""

from __future__ import annotations

from app.domain import node_operations as node_ops
from app.domain.drain import NODE_DRAIN_COMPLETE
from app.domain.model_spec import RolloutPolicy
from app.domain.state import ReplicaPhase
from tests.unit.test_drain_during_undo import Agents, drained_until_finished
from tests.unit.test_reconcile import Cluster
from tests.unit.test_rollouts import revise


def serving_on_two_nodes(policy: RolloutPolicy) -> tuple[Cluster, Agents]:
    """llama-1 serves on gpu-1, llama-2 on gpu-2; ``policy`` is the model's rollout policy."""
    cluster = Cluster()
    for node_id in ("gpu-1", "gpu-2"):
        cluster.node(node_id)
    cluster.model(replicas=2, rollout=policy)
    cluster.after(31)
    agents = Agents(cluster)
    agents.reconcile()
    agents.carry_out()
    agents.reconcile()
    assert {r.id: (r.node_ids, r.phase) for r in cluster.state.replicas.values()} == {
        "llama-1": (("gpu-1",), ReplicaPhase.SERVING),
        "llama-2": (("gpu-2",), ReplicaPhase.SERVING),
    }
    return cluster, agents


def test_a_replica_a_rollout_stops_before_the_drain_moves_it_is_not_said_to_have_moved() -> None:
    cluster, agents = serving_on_two_nodes(RolloutPolicy(max_surge=0, max_unavailable=1))
    revise(cluster)
    agents.reconcile()  # the rollout's step starts
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 3600).events)

    finished = drained_until_finished(cluster, agents, "gpu-1")

    # The rollout's max_unavailable stopped llama-1 before any replacement served: the
    # drain moved nothing, and says so.
    stopped = cluster.state.replicas["llama-1"]
    assert (stopped.phase, stopped.drain_id, stopped.replacement_id) == (
        ReplicaPhase.STOPPED,
        None,
        None,
    )
    assert finished.outcome != NODE_DRAIN_COMPLETE
    assert finished.outcome == (
        f"0 moved; 1 ended without a replacement: llama-1 ({stopped.end_reason})"
    )
    assert "max_unavailable 1" in finished.outcome


def test_a_drain_that_moved_every_replica_on_the_node_says_so() -> None:
    cluster, agents = serving_on_two_nodes(RolloutPolicy())
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 3600).events)

    finished = drained_until_finished(cluster, agents, "gpu-1")

    assert finished.outcome == NODE_DRAIN_COMPLETE
    moved = cluster.state.replicas["llama-1"]
    assert (moved.phase, moved.drain_id) == (ReplicaPhase.STOPPED, "drain-1")
    assert moved.replacement_id is not None
