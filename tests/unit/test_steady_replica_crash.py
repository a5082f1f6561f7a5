"""A replica that served steadily and then died (its engine killed, a GPU fault) is no
failure to start: it is replaced in the next pass, without the model's failure backoff,
and the gateways are not told the model is failing to start. One that dies soon after it
served still counts, so an engine that crashes on its first requests again and again is
held back."""

from __future__ import annotations

from msgspec.structs import replace

from app.domain.events import ReplicaPlaced, ShardFailed
from app.domain.model_operations import apply_model, scale
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


def test_an_engine_that_crashes_soon_after_it_serves_again_and_again_backs_off_longer() -> None:
    """Each replica serves for a second and crashes: a crash loop, whose backoff doubles
    as a failing start's does. Before, its serving reset the count, so every crash was
    the first, and the model was placed again every 10 s for ever."""
    cluster = one_serving_replica()
    cluster.after(1)
    crash(cluster, "llama-1")
    cluster.reconcile()
    cluster.after(11)
    assert [e.replica_id for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["llama-2"]
    cluster.serve("llama-2")
    cluster.reconcile()
    cluster.after(1)

    crash(cluster, "llama-2")
    cluster.reconcile()
    assert cluster.state.models["llama"].failures == 2
    cluster.after(11)
    assert of_type(cluster.reconcile(), ReplicaPlaced) == []
    cluster.after(10)
    assert [e.replica_id for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["llama-3"]


def test_a_failure_after_a_replica_served_steadily_starts_a_new_count() -> None:
    """Earlier crashes are forgiven once a replica of the model has served steadily: a
    replica that then fails to start waits the first backoff, not a doubled one."""
    cluster = one_serving_replica()
    cluster.after(1)
    crash(cluster, "llama-1")
    cluster.reconcile()
    cluster.after(11)
    cluster.reconcile()
    cluster.serve("llama-2")
    cluster.given(*scale(cluster.state, "llama", 2).events)
    cluster.after(STEADY_SERVING_S)
    assert [e.replica_id for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["llama-3"]

    crash(cluster, "llama-3")
    cluster.reconcile()
    assert cluster.state.models["llama"].failures == 1


def test_a_replica_serving_since_before_the_failures_does_not_forgive_them() -> None:
    """A model serves steadily on one replica; the replica added beside it fails to start,
    again and again: each failure counts, the backoff doubles, however long the first has
    served (it served before the failures began, so it ends no streak of them)."""
    cluster = one_serving_replica()
    cluster.after(STEADY_SERVING_S * 10)
    cluster.given(*scale(cluster.state, "llama", 2).events)
    counts = []
    for _ in range(3):
        [placed] = of_type(cluster.reconcile(), ReplicaPlaced)
        cluster.given(
            ShardFailed(
                replica_id=placed.replica_id,
                shard_index=0,
                node_id="gpu-1",
                error="engine exited with code 1: no such model file",
            )
        )
        cluster.reconcile()
        counts.append(cluster.state.models["llama"].failures)
        cluster.after(STEADY_SERVING_S * 10)  # past any backoff

    assert counts == [1, 2, 3]


def failing_to_start() -> Cluster:
    """A model whose one replica failed before it ever served: the model is in backoff."""
    cluster = Cluster()
    cluster.node("gpu-1")
    cluster.model(replicas=1)
    cluster.reconcile()
    cluster.given(
        ShardFailed(
            replica_id="llama-1",
            shard_index=0,
            node_id="gpu-1",
            error="engine exited with code 1: no such model file",
        )
    )
    cluster.reconcile()
    assert cluster.state.models["llama"].backoff_until is not None
    return cluster


def test_a_new_revision_starts_without_the_backoff_its_broken_revision_earned() -> None:
    """The operator fixed the command: the revision that runs it is placed at once, not
    after the wait the failures of the one before had earned (up to ten minutes)."""
    cluster = failing_to_start()
    spec = cluster.state.models["llama"].spec
    fixed = apply_model(cluster.state, replace(spec, command=f"{spec.command} --fixed"))
    cluster.given(*fixed.events)

    model = cluster.state.models["llama"]
    assert (model.revision, model.failures, model.backoff_until) == (2, 0, None)
    assert [e.replica_id for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["llama-2"]


def test_a_change_that_is_no_new_revision_keeps_the_backoff() -> None:
    """Scaling runs the same command: its failures still hold it back."""
    cluster = failing_to_start()
    cluster.given(*scale(cluster.state, "llama", 2).events)

    assert cluster.state.models["llama"].failures == 1
    assert of_type(cluster.reconcile(), ReplicaPlaced) == []
