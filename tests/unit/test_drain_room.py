"""Stories of a node drain asked whether its replicas have somewhere to go: given a
cluster, when a node's drain is decided, then each replica on the node has room for its
replacement or placement's reason why not; and the reconciler then does just that."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from msgspec.structs import replace

from app.domain import model_operations as model_ops
from app.domain import node_operations as node_ops
from app.domain.drain_room import ReplicaRoom
from app.domain.events import (
    ModelUnplaceable,
    NodeDrainRequested,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ShardPlacement,
)
from app.domain.model_spec import CanaryStep, RolloutPolicy
from app.domain.operation_results import NoRoomToDrain
from app.domain.state import ReplicaPhase
from tests.unit.test_reconcile import Cluster, of_type

NO_ROOM = (
    "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 2: 1 draining, "
    "1 not enough healthy free GPUs; each node counted once, under the first check it fails"
)
"""gpu-1 drains and its GPUs are in use; gpu-2's one GPU holds llama-1's replacement."""


def two_replicas_on_gpu_1_and_one_free_gpu_elsewhere(spare_gpus: int = 1) -> Cluster:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.node("gpu-2", n_gpus=spare_gpus)
    return _two_serving_replicas(
        cluster,
        lambda n: ShardPlacement(index=0, node_id="gpu-1", gpus=(n - 1,), port=20000 + n),
    )


def test_two_replicas_and_room_for_one_elsewhere_leaves_exactly_the_second_without_room() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere()

    drain = node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0)

    assert drain.events == (NodeDrainRequested(node_id="gpu-1", drain_id="drain-1", grace_s=600),)
    assert drain.room == (
        ReplicaRoom(replica_id="llama-1", model="llama", has_room=True),
        ReplicaRoom(replica_id="llama-2", model="llama", has_room=False, reason=NO_ROOM),
    )


def test_the_reconciler_then_moves_the_first_and_finds_no_room_for_the_second() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere()
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0).events)

    first = cluster.reconcile()
    assert [(e.replaces, e.shards[0].node_id) for e in of_type(first, ReplicaPlaced)] == [
        ("llama-1", "gpu-2")
    ]
    # explain-placement now says what the drain said of llama-2 up front.
    assert model_ops.placement_of(cluster.state, "llama").summary == NO_ROOM
    cluster.serve("llama-3")
    cluster.after(11)  # past the stability window: llama-1 stops, llama-2's move starts
    moved_on = [cluster.reconcile()]
    cluster.stop_reported("llama-1")
    moved_on += [cluster.reconcile(), cluster.reconcile()]

    assert [e.replica_id for d in moved_on for e in of_type(d, ReplicaDrainStarted)] == ["llama-2"]
    assert [e for d in moved_on for e in of_type(d, ReplicaPlaced)] == []
    assert {e.missing_replicas for d in moved_on for e in of_type(d, ModelUnplaceable)} == {1}
    assert cluster.state.replicas["llama-2"].replacement_id is None


def test_with_room_for_both_neither_is_warned_of() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere(spare_gpus=2)

    drain = node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0, require_room=True)

    assert [r.has_room for r in drain.room] == [True, True]
    assert [type(e) for e in drain.events] == [NodeDrainRequested]


def test_a_drain_that_requires_room_is_refused_naming_the_replica_without() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere()

    with pytest.raises(NoRoomToDrain) as refused:
        node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0, require_room=True)

    assert str(refused.value) == (
        f"node gpu-1 was not drained: 1 of 2 replica(s) on it have nowhere to go now "
        f"(llama-2: {NO_ROOM}); nothing was recorded"
    )
    assert [r.replica_id for r in refused.value.room if not r.has_room] == ["llama-2"]


def test_replicas_of_two_models_share_the_room_in_the_order_the_reconciler_places_them() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.node("gpu-2", n_gpus=1)
    cluster.model("qwen", replicas=1)
    cluster.model("llama", replicas=1)
    cluster.after(31)
    cluster.given(
        *(
            ReplicaPlaced(
                replica_id=f"{name}-1",
                model=name,
                number=1,
                shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(gpu,), port=20000 + gpu),),
            )
            for gpu, name in enumerate(("llama", "qwen"))
        )
    )
    cluster.serve("llama-1")
    cluster.serve("qwen-1")

    drain = node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0)

    # qwen was declared first: the reconciler places its replacement first.
    assert [(r.replica_id, r.has_room) for r in drain.room] == [
        ("qwen-1", True),
        ("llama-1", False),
    ]
    cluster.given(*drain.events)
    assert [e.replaces for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["qwen-1"]


def a_canary_of_two_gpus_on_gpu_1_and_one_free_gpu_elsewhere() -> Cluster:
    """llama's rollout holds at its canary step: llama-3, of revision 2 (two GPUs a replica),
    serves on gpu-1; llama-2, of revision 1 (one GPU), on gpu-3; gpu-2's one GPU is free."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.node("gpu-2", n_gpus=1)
    cluster.node("gpu-3", n_gpus=1)
    policy = RolloutPolicy(steps=(CanaryStep(replicas=1, hold_s=3600),))
    cluster.model(replicas=2, rollout=policy)
    cluster.after(31)
    cluster.given(
        *(
            ReplicaPlaced(
                replica_id=f"llama-{n}",
                model="llama",
                number=n,
                shards=(ShardPlacement(index=0, node_id=node, gpus=(0,), port=20000 + n),),
            )
            for n, node in ((1, "gpu-2"), (2, "gpu-3"))
        )
    )
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    spec = replace(cluster.state.models["llama"].spec, gpus_per_shard=2)
    cluster.given(*model_ops.apply_model(cluster.state, spec).events)
    for _ in range(6):
        cluster.reconcile()
        for replica in list(cluster.state.replicas.values()):
            if replica.phase is ReplicaPhase.PLACED:
                cluster.serve(replica.id)
            elif replica.phase is ReplicaPhase.STOPPING:
                cluster.stop_reported(replica.id)
        cluster.after(11)
    serving = {
        r.id: (r.revision, r.shards[0].node_id)
        for r in cluster.state.replicas.values()
        if r.phase is ReplicaPhase.SERVING
    }
    assert serving == {"llama-2": (1, "gpu-3"), "llama-3": (2, "gpu-1")}
    return cluster


def test_a_canary_drained_mid_rollout_is_placed_at_its_own_revision_and_has_no_room() -> None:
    """Drained, the canary no longer counts in its step: its replacement runs revision 2,
    which gpu-2's one GPU cannot hold, not revision 1, which it could."""
    cluster = a_canary_of_two_gpus_on_gpu_1_and_one_free_gpu_elsewhere()

    drain = node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0)

    assert [(r.replica_id, r.has_room) for r in drain.room] == [("llama-3", False)]
    cluster.given(*drain.events)
    assert of_type(cluster.reconcile(), ReplicaPlaced) == []


def test_a_replacement_not_serving_yet_on_the_node_is_placed_again_once_for_its_original() -> None:
    """llama-1 is being moved by a replica drain; its replacement, llama-3, starts on gpu-1.
    Drained, gpu-1 stops llama-3 and llama-1's move needs a replacement again: one
    placement, which gpu-4's one GPU holds, not one for each."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=1)
    cluster.node("gpu-2", n_gpus=1)
    cluster.node("gpu-3", n_gpus=1)
    cluster.model(replicas=2)
    cluster.after(31)
    cluster.given(
        *(
            ReplicaPlaced(
                replica_id=f"llama-{n}",
                model="llama",
                number=n,
                shards=(ShardPlacement(index=0, node_id=node, gpus=(0,), port=20000 + n),),
            )
            for n, node in ((1, "gpu-2"), (2, "gpu-3"))
        )
    )
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    cluster.given(ReplicaDrainStarted(replica_id="llama-1", drain_id="drain-r", reason="asked"))
    cluster.given(
        ReplicaPlaced(
            replica_id="llama-3",
            model="llama",
            number=3,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20003),),
            replaces="llama-1",
        )
    )
    cluster.node("gpu-4", n_gpus=1)

    drain = node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0)

    assert [(r.replica_id, r.has_room) for r in drain.room] == [("llama-3", True)]
    cluster.given(*drain.events)
    placed = of_type(cluster.reconcile(), ReplicaPlaced)
    assert [(e.replaces, e.shards[0].node_id) for e in placed] == [("llama-1", "gpu-4")]


def one_gpu_elsewhere_that_a_failed_replica_s_engine_still_fills() -> Cluster:
    """As ``two_replicas_on_gpu_1_and_one_free_gpu_elsewhere`` with two GPUs on gpu-2, but
    the log ended a replica of another model on gpu-2's GPU 0 whose engine gpu-2 still
    reports running (on its way out): the reconciler places nothing on that GPU."""
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere(spare_gpus=2)
    cluster.model("qwen", replicas=0)
    cluster.failed_still_running("gpu-2", "qwen-1", "qwen")
    return cluster


def test_a_gpu_an_engine_still_runs_on_is_no_room_for_a_drain_as_for_the_reconciler() -> None:
    cluster = one_gpu_elsewhere_that_a_failed_replica_s_engine_still_fills()

    drain = node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0, running=cluster.reports)

    assert drain.room == (
        ReplicaRoom(replica_id="llama-1", model="llama", has_room=True),
        ReplicaRoom(replica_id="llama-2", model="llama", has_room=False, reason=NO_ROOM),
    )
    cluster.given(*drain.events)
    [placed] = of_type(cluster.reconcile(), ReplicaPlaced)
    assert (placed.replaces, placed.shards[0].gpus) == ("llama-1", (1,))


def test_explain_placement_holds_a_gpu_an_engine_still_runs_on_as_the_reconciler_does() -> None:
    cluster = one_gpu_elsewhere_that_a_failed_replica_s_engine_still_fills()
    cluster.given(*model_ops.scale(cluster.state, "llama", 3).events)

    explained = model_ops.placement_of(cluster.state, "llama", cluster.reports)

    [gpu_2] = [c for c in explained.candidates if c.node_id == "gpu-2"]
    assert (gpu_2.gpus, gpu_2.port) == ((1,), 20001)
    assert explained.placement is not None
    [placed] = of_type(cluster.reconcile(), ReplicaPlaced)
    assert placed.shards == explained.placement


def one_replica_on_each_of_two_nodes_and_one_free_gpu_on_a_third() -> Cluster:
    cluster = Cluster()
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        cluster.node(node, n_gpus=1)
    return _two_serving_replicas(
        cluster, lambda n: ShardPlacement(index=0, node_id=f"gpu-{n}", gpus=(0,), port=20000)
    )


def _two_serving_replicas(cluster: Cluster, shard_of: Callable[[int], ShardPlacement]) -> Cluster:
    """``cluster`` with llama's two replicas placed (replica n's shard ``shard_of(n)``) and
    serving, past the adoption grace."""
    cluster.model(replicas=2)
    cluster.after(31)  # past the adoption grace
    cluster.given(
        *(
            ReplicaPlaced(replica_id=f"llama-{n}", model="llama", number=n, shards=(shard_of(n),))
            for n in (1, 2)
        )
    )
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    return cluster


def test_a_second_drain_finds_the_room_a_first_drain_not_yet_started_will_take() -> None:
    cluster = one_replica_on_each_of_two_nodes_and_one_free_gpu_on_a_third()
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0).events)

    # The reconciler has not made a pass since: llama-1 is not draining yet.
    assert cluster.state.replicas["llama-1"].phase is ReplicaPhase.SERVING
    second = node_ops.drain_node(cluster.state, "gpu-2", "drain-2", 600.0)

    [room] = second.room
    assert (room.replica_id, room.has_room) == ("llama-2", False)
    assert room.reason == (
        "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 3: 2 draining, 1 not enough "
        "healthy free GPUs; each node counted once, under the first check it fails"
    )  # gpu-3's GPU holds llama-1's replacement
    with pytest.raises(NoRoomToDrain):
        node_ops.drain_node(cluster.state, "gpu-2", "drain-2", 600.0, require_room=True)
