"""Stories of a replica whose GPU turns unhealthy: the reconciler moves it as a replica
drain without grace moves one (a replacement on a healthy GPU, the original stopped once
the replacement has served), once per replica, never stops the original first, and moves
at most its model's ``max_moves`` at a time."""

from __future__ import annotations

from app.domain.decision import RECONCILER
from app.domain.events import (
    GpuMarkedUnhealthy,
    GpuRecovered,
    ModelUnplaceable,
    NodeDrainRequested,
    ReplacementServing,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaStopping,
    ShardStarting,
)
from app.domain.model_status import model_status
from app.domain.state import ReplicaPhase
from tests.unit.test_reconcile import Cluster, commands, kinds, of_type

FLAPPING = "flapping: 5 health changes within 60s; held unhealthy until stable for 120s"


def _serving_on_one_of_two_nodes(n_gpus: int = 2) -> Cluster:
    """llama-1 serves on one GPU of gpu-1; gpu-2 has room for a replacement."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=n_gpus)
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.node("gpu-2", n_gpus=n_gpus)
    return cluster


def _gpu_of(cluster: Cluster, replica_id: str) -> tuple[str, int]:
    shard = cluster.state.replicas[replica_id].shards[0]
    return shard.node_id, shard.gpus[0]


def test_a_replica_on_a_gpu_turned_unhealthy_is_moved_to_a_healthy_one_once() -> None:
    cluster = _serving_on_one_of_two_nodes()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason="XID 48: ECC error"))

    decision = cluster.reconcile()

    assert kinds(decision) == ["ReplicaDrainStarted", "ReplicaPlaced"]
    (started,) = of_type(decision, ReplicaDrainStarted)
    assert started.replica_id == "llama-1"
    assert started.reason == f"GPU {gpu} of node {node} is unhealthy (XID 48: ECC error)"
    assert {p.actor for p in decision.events} == {RECONCILER}
    (placed,) = of_type(decision, ReplicaPlaced)
    assert placed.replaces == "llama-1"
    assert (placed.shards[0].node_id, placed.shards[0].gpus) != (node, (gpu,))
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING
    assert cluster.state.replicas["llama-1"].routable  # it serves until its replacement does
    # The pass runs every second: the next records no second move.
    assert cluster.reconcile().events == ()
    assert cluster.reconcile().events == ()


def test_a_gpu_held_unhealthy_as_flapping_moves_its_replica_too() -> None:
    cluster = _serving_on_one_of_two_nodes()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason=FLAPPING))

    (started,) = of_type(cluster.reconcile(), ReplicaDrainStarted)

    assert started.reason == f"GPU {gpu} of node {node} is unhealthy ({FLAPPING})"


def test_an_unhealthy_gpu_that_no_replica_uses_moves_nothing() -> None:
    cluster = _serving_on_one_of_two_nodes()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=1 - gpu, reason="XID 79"))

    assert cluster.reconcile().events == ()
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING


def test_the_original_stops_only_once_its_replacement_served_even_after_the_gpu_recovered() -> None:
    cluster = _serving_on_one_of_two_nodes()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason="XID 48"))
    cluster.reconcile()
    cluster.given(GpuRecovered(node_id=node, gpu_index=gpu))

    assert cluster.reconcile().events == ()  # recovery does not call the move off
    cluster.serve("llama-2")
    cluster.after(11)
    decision = cluster.reconcile()

    assert kinds(decision) == ["ReplacementServing", "ReplicaStopping"]
    assert [e.replacement_id for e in of_type(decision, ReplacementServing)] == ["llama-2"]
    assert "stop-llama-1-0" in commands(decision)


def test_without_room_the_move_waits_past_any_grace_and_the_original_serves_on() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=1)
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.given(GpuMarkedUnhealthy(node_id="gpu-1", gpu_index=0, reason="XID 48"))

    decision = cluster.reconcile()
    assert kinds(decision) == ["ReplicaDrainStarted", "ModelUnplaceable"]
    assert "not enough healthy free GPUs" in of_type(decision, ModelUnplaceable)[0].reason

    cluster.after(3600)  # far past an operator's replica drain's grace (600 s)
    assert of_type(cluster.reconcile(), ReplicaStopping) == []
    assert cluster.phase("llama-1") is ReplicaPhase.DRAINING
    assert cluster.state.replicas["llama-1"].routable


def test_a_replica_still_starting_on_an_unhealthy_gpu_is_moved_too() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.model(replicas=1)
    cluster.after(31)
    cluster.reconcile()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(ShardStarting(replica_id="llama-1", shard_index=0, node_id=node, pid=7))
    cluster.running(node, "llama-1", cluster.state.replicas["llama-1"].shards[0].port)
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason="XID 48"))

    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaDrainStarted)] == ["llama-1"]
    assert [e.replaces for e in of_type(decision, ReplicaPlaced)] == ["llama-1"]


def test_a_replica_already_being_moved_is_left_to_that_move() -> None:
    cluster = _serving_on_one_of_two_nodes()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(ReplicaDrainStarted(replica_id="llama-1", drain_id="drain-1"))
    cluster.reconcile()
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason="XID 48"))

    assert of_type(cluster.reconcile(), ReplicaDrainStarted) == []
    assert cluster.state.replicas["llama-1"].drain_id == "drain-1"


def test_a_replica_on_a_draining_node_is_left_to_the_node_s_drain() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.model(replicas=2, max_moves=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.node("gpu-2", n_gpus=2)
    node, gpu = _gpu_of(cluster, "llama-2")
    cluster.given(NodeDrainRequested(node_id="gpu-1", drain_id="drain-7", grace_s=600))
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason="XID 48"))

    decision = cluster.reconcile()

    # The drain moves one at a time; llama-2 waits for its turn in the drain.
    started = of_type(decision, ReplicaDrainStarted)
    assert [(e.replica_id, e.drain_id) for e in started] == [("llama-1", "drain-7")]
    assert cluster.phase("llama-2") is ReplicaPhase.SERVING


def test_a_move_an_operator_called_off_is_not_started_again() -> None:
    cluster = _serving_on_one_of_two_nodes()
    node, gpu = _gpu_of(cluster, "llama-1")
    cluster.given(GpuMarkedUnhealthy(node_id=node, gpu_index=gpu, reason="XID 48"))
    (started,) = of_type(cluster.reconcile(), ReplicaDrainStarted)
    cluster.serve("llama-2")
    cluster.given(
        ReplicaDrainCancelled(replica_id="llama-1", drain_id=started.drain_id, reason="kept")
    )

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaDrainStarted) == []
    assert [e.replica_id for e in of_type(decision, ReplicaStopping)] == ["llama-2"]
    assert cluster.phase("llama-1") is ReplicaPhase.SERVING
    cluster.after(60)
    assert of_type(cluster.reconcile(), ReplicaDrainStarted) == []


def four_serving_on_a_node_whose_gpus_all_fail(**spec: object) -> Cluster:
    """llama-1..4 serve on the four GPUs of gpu-1, gpu-2 has four free, and every GPU of
    gpu-1 turns unhealthy at once (a driver crash)."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=4)
    cluster.model(replicas=4, **spec)
    cluster.after(31)
    cluster.reconcile()
    for n in range(1, 5):
        cluster.serve(f"llama-{n}")
    cluster.node("gpu-2", n_gpus=4)
    for gpu in range(4):
        cluster.given(GpuMarkedUnhealthy(node_id="gpu-1", gpu_index=gpu, reason="XID 79"))
    return cluster


def _moving(cluster: Cluster) -> list[str]:
    return sorted(cluster.state.models["llama"].moves)


def test_a_node_whose_every_gpu_fails_moves_at_most_max_moves_replicas_at_a_time() -> None:
    cluster = four_serving_on_a_node_whose_gpus_all_fail(max_moves=1)

    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaDrainStarted)] == ["llama-1"]
    assert [e.replaces for e in of_type(decision, ReplicaPlaced)] == ["llama-1"]
    assert [cluster.phase(f"llama-{n}") for n in (2, 3, 4)] == [ReplicaPhase.SERVING] * 3
    assert model_status(cluster.state, "llama", cluster.now).waiting_to_move == tuple(
        f"llama-{n} waits to move off an unhealthy GPU (GPU {n - 1} of node gpu-1 is "
        "unhealthy (XID 79)): 1 move(s) of llama under way, at most 1 (max_moves) at a time"
        for n in (2, 3, 4)
    )
    assert of_type(cluster.reconcile(), ReplicaDrainStarted) == []  # it waits its turn

    cluster.serve("llama-5")
    cluster.after(11)
    ended = cluster.reconcile()  # llama-1's replacement has served for the window
    assert [e.replica_id for e in of_type(ended, ReplicaStopping)] == ["llama-1"]
    assert [e.replica_id for e in of_type(cluster.reconcile(), ReplicaDrainStarted)] == ["llama-2"]
    assert _moving(cluster) == ["llama-2"]


def test_max_moves_of_two_moves_two_off_the_failed_gpus_at_once() -> None:
    cluster = four_serving_on_a_node_whose_gpus_all_fail(max_moves=2)

    decision = cluster.reconcile()

    assert [e.replica_id for e in of_type(decision, ReplicaDrainStarted)] == [
        "llama-1",
        "llama-2",
    ]
    assert [e.replaces for e in of_type(decision, ReplicaPlaced)] == ["llama-1", "llama-2"]
    waiting = model_status(cluster.state, "llama", cluster.now).waiting_to_move
    assert [line.split()[0] for line in waiting] == ["llama-3", "llama-4"]


def test_a_gpu_move_waits_for_the_model_s_moves_of_any_kind_under_way() -> None:
    cluster = four_serving_on_a_node_whose_gpus_all_fail(max_moves=1)
    cluster.given(GpuRecovered(node_id="gpu-1", gpu_index=3))
    # An operator's drain of llama-4, on a healthy GPU, takes the model's one move.
    cluster.given(ReplicaDrainStarted(replica_id="llama-4", drain_id="drain-4"))

    decision = cluster.reconcile()

    assert of_type(decision, ReplicaDrainStarted) == []
    assert [e.replaces for e in of_type(decision, ReplicaPlaced)] == ["llama-4"]
    assert _moving(cluster) == ["llama-4"]
    waiting = model_status(cluster.state, "llama", cluster.now).waiting_to_move
    assert [line.split()[0] for line in waiting] == ["llama-1", "llama-2", "llama-3"]
