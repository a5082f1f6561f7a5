"""Stories of a node drain an operator calls off (``node_drain_cancelled``), at each stage of
its moves, on a fixed clock: the reconciler's next pass calls off each move still under way
(its original serves and counts again), finishes the drain as cancelled, and the scale rule
stops the replacement the model no longer needs. Nothing more is moved or stopped for the
drain afterwards, and the node stays cordoned."""

from __future__ import annotations

from app.domain.events import (
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaStopping,
    ShardPlacement,
)
from app.domain.state import ReplicaPhase
from tests.unit.test_reconcile import Cluster, kinds, of_type, serving_on_two_of_three_nodes

DRAIN = "drain-1"


def draining_llama_1() -> tuple[Cluster, str]:
    """llama-1 and llama-2 serve on two of three nodes; llama-1's node drains, and the
    first pass started its move and placed its replacement, llama-3."""
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id=DRAIN, grace_s=600))
    assert kinds(cluster.reconcile()) == ["ReplicaDrainStarted", "ReplicaPlaced"]
    return cluster, node


def cancelled(cluster: Cluster, node: str) -> None:
    cluster.given(NodeDrainCancelled(node_id=node, drain_id=DRAIN))


def test_a_cancelled_drain_calls_off_the_move_and_stops_the_replacement_not_serving_yet() -> None:
    cluster, node = draining_llama_1()
    cancelled(cluster, node)

    decision = cluster.reconcile()

    assert kinds(decision) == ["ReplicaDrainCancelled", "NodeDrainFinished", "ReplicaStopping"]
    (called_off,) = of_type(decision, ReplicaDrainCancelled)
    assert (called_off.replica_id, called_off.drain_id) == ("llama-1", DRAIN)
    (finished,) = of_type(decision, NodeDrainFinished)
    assert (finished.outcome, finished.succeeded) == ("cancelled by test", False)
    (stopping,) = of_type(decision, ReplicaStopping)
    assert (stopping.replica_id, stopping.surplus) == ("llama-3", True)
    assert stopping.reason == (
        "replacement for llama-1 no longer needed: its move was called off and llama-1 serves on"
    )
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    assert cluster.state.nodes[node].cordoned
    assert cluster.state.nodes[node].drain_id is None
    assert cluster.state.models["llama"].moves == {}


def test_a_replacement_already_serving_is_the_one_stopped_not_the_original() -> None:
    cluster, node = draining_llama_1()
    cluster.serve("llama-3")
    cluster.after(5)  # serving, but not for the stability window yet
    cancelled(cluster, node)

    decision = cluster.reconcile()

    assert [s.replica_id for s in of_type(decision, ReplicaStopping)] == ["llama-3"]
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING


def test_an_original_already_stopping_stays_stopped_and_its_replacement_serves() -> None:
    cluster, node = draining_llama_1()
    cluster.serve("llama-3")
    cluster.after(11)
    assert kinds(cluster.reconcile()) == ["ReplacementServing", "ReplicaStopping"]
    cancelled(cluster, node)

    decision = cluster.reconcile()

    assert kinds(decision) == ["NodeDrainFinished"]
    assert of_type(decision, NodeDrainFinished)[0].outcome == "cancelled by test"
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING
    assert cluster.phase("llama-3") is ReplicaPhase.SERVING


def test_after_a_cancel_nothing_more_is_moved_or_stopped_for_the_drain() -> None:
    cluster, node = draining_llama_1()
    cluster.serve("llama-3")
    cancelled(cluster, node)
    cluster.reconcile()
    cluster.stop_reported("llama-3")
    cluster.reconcile()

    for _ in range(3):
        cluster.after(60)
        assert cluster.reconcile().events == ()
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    assert cluster.state.nodes[node].cordoned


def test_a_replica_the_drain_had_not_reached_yet_is_never_moved() -> None:
    cluster = Cluster()
    for node in ("gpu-1", "gpu-2"):
        cluster.node(node)
    cluster.model(replicas=2)  # max_moves 1: one move at a time
    cluster.after(31)
    cluster.reconcile()
    cluster.state.replicas.clear()
    cluster.given(
        *(
            ReplicaPlaced(
                replica_id=f"llama-{n}",
                model="llama",
                number=n,
                shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(n,), port=20000 + n),),
            )
            for n in (1, 2)
        )
    )
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(NodeDrainRequested(node_id="gpu-1", drain_id=DRAIN, grace_s=600))
    assert [s.replica_id for s in of_type(cluster.reconcile(), ReplicaDrainStarted)] == ["llama-1"]
    cancelled(cluster, "gpu-1")

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaDrainStarted) == []
    assert [c.replica_id for c in of_type(decision, ReplicaDrainCancelled)] == ["llama-1"]
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING
    assert of_type(cluster.reconcile(), ReplicaDrainStarted) == []


def test_a_cancellation_of_a_drain_that_finished_first_changes_nothing() -> None:
    cluster, node = draining_llama_1()
    cluster.given(NodeDrainFinished(node_id=node, drain_id=DRAIN, outcome="every replica moved"))
    cancelled(cluster, node)

    assert cluster.state.nodes[node].drain_cancelled_by is None
    assert of_type(cluster.reconcile(), NodeDrainFinished) == []


def test_a_cancel_recorded_while_a_pass_stopped_the_original_leaves_the_model_at_its_count() -> (
    None
):
    """The pass read the log before the cancel and appends after it: the original stops
    as decided, and its replacement, serving, keeps the model at its count."""
    cluster, node = draining_llama_1()
    cluster.serve("llama-3")
    cluster.after(11)
    decision = cluster.decided()
    assert kinds(decision) == ["ReplacementServing", "ReplicaStopping"]
    cancelled(cluster, node)

    assert cluster.appended(decision) is None
    after = cluster.reconcile()

    assert kinds(after) == ["NodeDrainFinished"]
    assert of_type(after, NodeDrainFinished)[0].outcome == "cancelled by test"
    assert cluster.phase("llama-1") is ReplicaPhase.STOPPING
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING
    assert cluster.phase("llama-3") is ReplicaPhase.SERVING
    assert cluster.state.models["llama"].moves == {}
    cluster.stop_reported("llama-1")
    assert kinds(cluster.reconcile()) == ["ReplicaStopped"]
    for _ in range(3):
        cluster.after(60)
        assert cluster.reconcile().events == ()
    serving = [r.id for r in cluster.state.replicas.values() if r.phase is ReplicaPhase.SERVING]
    assert sorted(serving) == ["llama-2", "llama-3"], "the model's count, no more, no less"


def test_a_cancel_recorded_while_a_pass_began_the_move_calls_the_move_off_next_pass() -> None:
    """The pass that started the move and placed its replacement read the log before the
    cancel and appends after it: the next pass calls the move off, the original serves
    and counts again, and the replacement beyond the count is stopped."""
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id=DRAIN, grace_s=600))
    decision = cluster.decided()
    assert kinds(decision) == ["ReplicaDrainStarted", "ReplicaPlaced"]
    cancelled(cluster, node)

    assert cluster.appended(decision) is None
    after = cluster.reconcile()

    assert kinds(after) == ["ReplicaDrainCancelled", "NodeDrainFinished", "ReplicaStopping"]
    (stopping,) = of_type(after, ReplicaStopping)
    assert (stopping.replica_id, stopping.surplus) == ("llama-3", True)
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING
    assert cluster.state.nodes[node].cordoned
    assert cluster.state.models["llama"].moves == {}
