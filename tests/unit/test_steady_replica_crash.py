"""A replica that served steadily and then died (its engine killed, a GPU fault) is no
failure to start: it is replaced in the next pass, without the model's failure backoff,
and the gateways are not told the model is failing to start. One that dies soon after it
served still counts, so an engine that crashes on its first requests again and again is
held back."""

from __future__ import annotations

from app.domain.events import ReplicaPlaced, ShardFailed
from tests.unit.test_reconcile import Cluster, of_type

STEADY_SERVING_S = 60.0
"""``app.domain.state.STEADY_SERVING_S``: how long a replica serves to count as steady."""


def crash(cluster: Cluster, replica_id: str) -> None:
    cluster.given(
        ShardFailed(
            replica_id=replica_id,
            shard_index=0,
            node_id=cluster.state.replicas[replica_id].shards[0].node_id,
            error="engine was killed by SIGKILL",
        )
    )


def one_serving_replica() -> Cluster:
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    return cluster


def test_a_replica_that_served_steadily_and_died_is_replaced_at_once() -> None:
    cluster = one_serving_replica()
    cluster.after(STEADY_SERVING_S)

    crash(cluster, "llama-1")
    placed = of_type(cluster.reconcile(), ReplicaPlaced)

    # The pass that records replica_failed places its replacement.
    assert [e.replica_id for e in placed] == ["llama-2"]
    model = cluster.state.models["llama"]
    assert (model.failures, model.backoff_until) == (0, None)


def test_a_replica_that_died_soon_after_it_served_puts_the_model_in_backoff() -> None:
    cluster = one_serving_replica()
    cluster.after(STEADY_SERVING_S - 1)

    crash(cluster, "llama-1")
    placed = [*of_type(cluster.reconcile(), ReplicaPlaced)]
    placed += of_type(cluster.reconcile(), ReplicaPlaced)

    assert placed == []
    assert cluster.state.models["llama"].failures == 1
    cluster.after(11)
    assert [e.replica_id for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["llama-2"]
