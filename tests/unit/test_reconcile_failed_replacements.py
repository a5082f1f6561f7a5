"""Stories of the placements that fill the place of a replica that ended unasked (failed,
timed out at start-up, lost): each one names the replica it takes over from and why that
one ended, so the history says why the new one exists."""

from __future__ import annotations

from app.domain.events import (
    ModelScaled,
    NodeDrainRequested,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaStartupTimedOut,
)
from tests.unit.test_reconcile import (
    of_type,
    serving_on_two_of_three_nodes,
    with_two_nodes_and_a_model,
)


def placed_reasons(decision: object) -> dict[str, str]:
    return {e.replica_id: e.reason for e in of_type(decision, ReplicaPlaced)}  # type: ignore[arg-type]


def test_the_placement_after_a_failure_names_the_failed_replica() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(ReplicaFailed(replica_id="llama-2", reason="engine exited with code 1"))
    cluster.after(11)  # past the model's backoff

    decision = cluster.reconcile()

    assert placed_reasons(decision) == {
        "llama-3": "replaces llama-2, which failed (engine exited with code 1), "
        "below desired count (1 of 2)"
    }
    (placed,) = of_type(decision, ReplicaPlaced)
    assert placed.replaces is None, "a failed replica is no move: nothing waits on it"


def test_two_failures_are_named_by_one_placement_each_earliest_ended_first() -> None:
    cluster = with_two_nodes_and_a_model(replicas=3)
    cluster.reconcile()
    for replica_id in ("llama-1", "llama-2", "llama-3"):
        cluster.serve(replica_id)
    cluster.given(ReplicaLost(replica_id="llama-3", reason="node gpu-2 lost"))
    cluster.after(1)
    cluster.given(ReplicaFailed(replica_id="llama-1", reason="engine exited with code 1"))
    cluster.after(11)  # past the model's backoff

    decision = cluster.reconcile()

    assert placed_reasons(decision) == {
        "llama-4": "replaces llama-3, which was lost (node gpu-2 lost), "
        "below desired count (1 of 3)",
        "llama-5": "replaces llama-1, which failed (engine exited with code 1), "
        "below desired count (2 of 3)",
    }


def test_a_replacement_that_fails_in_turn_is_named_by_the_next_pass_and_no_end_twice() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.given(ReplicaStartupTimedOut(replica_id="llama-1", waited_s=300, timeout_s=300))
    cluster.after(11)  # past the model's backoff
    first = cluster.reconcile()
    cluster.given(ReplicaFailed(replica_id="llama-2", reason="engine exited with code 1"))
    cluster.after(21)
    second = cluster.reconcile()

    assert placed_reasons(first) == {
        "llama-2": "replaces llama-1, which timed out starting after 300s (limit 300s), "
        "below desired count (0 of 1)"
    }
    assert placed_reasons(second) == {
        "llama-3": "replaces llama-2, which failed (engine exited with code 1), "
        "below desired count (0 of 1)"
    }


def test_a_scale_up_with_nothing_ended_keeps_below_desired_count() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(ModelScaled(model="llama", replicas=2, previous=1))

    assert placed_reasons(cluster.reconcile()) == {"llama-2": "below desired count (1 of 2)"}


def test_a_failure_whose_place_was_filled_is_not_named_by_a_later_scale_up() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(ReplicaFailed(replica_id="llama-1", reason="engine exited with code 1"))
    cluster.after(11)
    cluster.reconcile()
    cluster.serve("llama-2")
    cluster.given(ModelScaled(model="llama", replicas=2, previous=1))

    assert placed_reasons(cluster.reconcile()) == {"llama-3": "below desired count (1 of 2)"}


def test_a_drain_replacement_that_fails_is_replaced_by_the_drain_and_named_by_no_one_else() -> None:
    cluster = serving_on_two_of_three_nodes()
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(NodeDrainRequested(node_id=node, drain_id="drain-1", grace_s=600))
    cluster.reconcile()  # places llama-3 for llama-1
    cluster.given(ReplicaFailed(replica_id="llama-3", reason="engine exited with code 1"))
    cluster.after(11)

    again = cluster.reconcile()
    cluster.given(ReplicaLost(replica_id="llama-2", reason="node gpu-9 lost"))
    later = cluster.reconcile()

    assert placed_reasons(again) == {"llama-4": "replacement for llama-1 (drain drain-1)"}
    assert placed_reasons(later) == {
        "llama-5": "replaces llama-2, which was lost (node gpu-9 lost), "
        "below desired count (1 of 2)"
    }


def test_a_failure_whose_place_a_scale_down_closed_is_not_named_by_a_later_scale_up() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(ReplicaFailed(replica_id="llama-2", reason="engine exited with code 1"))
    cluster.given(ModelScaled(model="llama", replicas=1, previous=2))
    cluster.after(11)
    assert placed_reasons(cluster.reconcile()) == {}
    cluster.given(ModelScaled(model="llama", replicas=2, previous=1))

    assert placed_reasons(cluster.reconcile()) == {"llama-3": "below desired count (1 of 2)"}
