"""Stories of a node drain asked whether its replicas have somewhere to go: given a
cluster, when a node's drain is decided, then each replica on the node has room for its
replacement or placement's reason why not; and the reconciler then does just that."""

from __future__ import annotations

import pytest

from app.domain import operations as ops
from app.domain.drain_room import ReplicaRoom
from app.domain.events import (
    ModelUnplaceable,
    NodeDrainRequested,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ShardPlacement,
)
from tests.unit.test_reconcile import Cluster, of_type

NO_ROOM = (
    "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 2: 1 draining, "
    "2 not enough healthy free GPUs"
)
"""gpu-1 drains and its GPUs are in use; gpu-2's one GPU holds llama-1's replacement."""


def two_replicas_on_gpu_1_and_one_free_gpu_elsewhere(spare_gpus: int = 1) -> Cluster:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.node("gpu-2", n_gpus=spare_gpus)
    cluster.model(replicas=2)
    cluster.after(31)  # past the adoption grace
    cluster.given(
        *(
            ReplicaPlaced(
                replica_id=f"llama-{n}",
                model="llama",
                number=n,
                shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(n - 1,), port=20000 + n),),
            )
            for n in (1, 2)
        )
    )
    cluster.serve("llama-1")
    cluster.serve("llama-2")
    return cluster


def test_two_replicas_and_room_for_one_elsewhere_leaves_exactly_the_second_without_room() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere()

    drain = ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0)

    assert drain.events == (NodeDrainRequested(node_id="gpu-1", drain_id="drain-1", grace_s=600),)
    assert drain.room == (
        ReplicaRoom(replica_id="llama-1", model="llama", has_room=True),
        ReplicaRoom(replica_id="llama-2", model="llama", has_room=False, reason=NO_ROOM),
    )


def test_the_reconciler_then_moves_the_first_and_finds_no_room_for_the_second() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere()
    cluster.given(*ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0).events)

    first = cluster.reconcile()
    assert [(e.replaces, e.shards[0].node_id) for e in of_type(first, ReplicaPlaced)] == [
        ("llama-1", "gpu-2")
    ]
    # explain-placement now says what the drain said of llama-2 up front.
    assert ops.placement_of(cluster.state, "llama").summary == NO_ROOM
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

    drain = ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0, require_room=True)

    assert [r.has_room for r in drain.room] == [True, True]
    assert [type(e) for e in drain.events] == [NodeDrainRequested]


def test_a_drain_that_requires_room_is_refused_naming_the_replica_without() -> None:
    cluster = two_replicas_on_gpu_1_and_one_free_gpu_elsewhere()

    with pytest.raises(ops.NoRoomToDrain) as refused:
        ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0, require_room=True)

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

    drain = ops.drain_node(cluster.state, "gpu-1", "drain-1", 600.0)

    # qwen was declared first: the reconciler places its replacement first.
    assert [(r.replica_id, r.has_room) for r in drain.room] == [
        ("qwen-1", True),
        ("llama-1", False),
    ]
    cluster.given(*drain.events)
    assert [e.replaces for e in of_type(cluster.reconcile(), ReplicaPlaced)] == ["qwen-1"]
