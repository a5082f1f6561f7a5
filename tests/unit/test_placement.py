"""Placement explains itself: every node, every failed check, in words."""

from __future__ import annotations

import itertools

from app.domain.allocation import NOTHING_REPORTED, Allocations
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    GpuMarkedUnhealthy,
    ModelDeclared,
    NodeConnected,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainRequested,
    ReplicaFailed,
    ReplicaPlaced,
    ShardFailed,
    ShardPlacement,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.placement import Placer, explain_placement
from tests.unit.test_fold import log_of

H100 = 81559  # MiB, as NVML reports an H100 80GB


_MACHINES = itertools.count()


def gpus(n: int, used_mib: int = 0) -> tuple[GpuInfo, ...]:
    """``n`` GPUs of a machine of their own: no two calls list one UUID
    (``app.domain.gpu_claims``)."""
    machine = next(_MACHINES)
    return tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{machine}-{i}",
            name="H100",
            memory_total_mib=H100,
            memory_used_mib=used_mib,
        )
        for i in range(n)
    )


SPEC = ModelSpec(
    name="llama-70b", command="vllm serve --port {port}", gpus_per_shard=4, gpu_memory_gib=70
)


def test_every_node_is_listed_with_every_reason_and_the_chosen_one_with_why() -> None:
    state = replay(
        log_of(
            NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(4)),
            GpuMarkedUnhealthy(
                node_id="gpu-1", gpu_index=3, reason="XID 79, fallen off the bus", xid=79
            ),
            ModelDeclared(model="llama-70b", spec=SPEC),
            ReplicaPlaced(
                replica_id="llama-70b-3",
                model="llama-70b",
                number=3,
                shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(1,), port=20000),),
            ),
            NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(8)),
            NodeCordoned(node_id="gpu-2", reason="bad fan"),
            NodeConnected(node_id="gpu-3", address="127.0.0.3", gpus=gpus(8, used_mib=40_000)),
            NodeConnected(node_id="gpu-4", address="127.0.0.4", gpus=gpus(8), labels={"zone": "b"}),
            NodeConnected(node_id="gpu-5", address="127.0.0.5", gpus=gpus(8)),
            NodeDisconnected(node_id="gpu-5", reason="heartbeat timeout"),
            NodeConnected(node_id="gpu-6", address="127.0.0.6", gpus=gpus(8)),
            NodeDrainRequested(node_id="gpu-6", drain_id="drain-1", grace_s=60),
        )
    )

    explanation = explain_placement(state, SPEC)
    reasons = {c.node_id: c.reasons for c in explanation.candidates}

    assert reasons["gpu-1"] == (
        "needs 4 healthy GPU(s) with 70 GiB free, has 2: "
        "GPU 1 used by llama-70b-3, GPU 3 unhealthy (XID 79, fallen off the bus)",
    )
    assert reasons["gpu-2"] == ("cordoned (bad fan)",)
    assert reasons["gpu-3"][0].startswith(
        "needs 4 healthy GPU(s) with 70 GiB free, has 0: GPU 0 has 41 GiB free"
    )
    assert reasons["gpu-4"] == ()
    assert reasons["gpu-5"] == ("not connected",)
    assert reasons["gpu-6"] == ("draining (drain drain-1)",)
    assert explanation.placement is not None
    assert explanation.placement[0].node_id == "gpu-4"
    assert explanation.placement[0].gpus == (0, 1, 2, 3)
    assert explanation.summary.startswith("would place on gpu-4 (GPUs 0,1,2,3, port 20000")


def test_a_label_selector_names_what_the_node_lacks() -> None:
    state = replay(
        log_of(NodeConnected(node_id="gpu-1", address="a", gpus=gpus(8), labels={"zone": "a"}))
    )
    spec = ModelSpec(name="m", command="x", node_selector={"zone": "b", "pool": "prod"})

    explanation = explain_placement(state, spec)

    assert explanation.candidates[0].reasons == (
        "labels do not match: needs pool=prod (node has none), zone=b (node has a)",
    )
    assert explanation.placement is None
    assert explanation.summary == (
        "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 1: 1 labels do not match"
    )


def test_replicas_of_a_model_spread_then_pack_then_break_ties_by_node_id() -> None:
    state = replay(
        log_of(
            NodeConnected(node_id="gpu-b", address="b", gpus=gpus(8)),
            NodeConnected(node_id="gpu-a", address="a", gpus=gpus(8)),
            NodeConnected(node_id="gpu-c", address="c", gpus=gpus(2)),
            ModelDeclared(model="m", spec=ModelSpec(name="m", command="x", gpus_per_shard=2)),
            ReplicaPlaced(
                replica_id="m-1",
                model="m",
                number=1,
                shards=(ShardPlacement(index=0, node_id="gpu-c", gpus=(0, 1), port=20000),),
            ),
        )
    )
    spec = state.models["m"].spec

    placement = explain_placement(state, spec).placement

    # gpu-c already runs m (and is full); a and b are equal, so the id decides.
    assert placement is not None
    assert placement[0].node_id == "gpu-a"


def test_a_multi_node_replica_takes_distinct_nodes() -> None:
    state = replay(
        log_of(
            *(
                NodeConnected(node_id=f"gpu-{i}", address=f"127.0.0.{i}", gpus=gpus(8))
                for i in (1, 2, 3)
            )
        )
    )
    spec = ModelSpec(name="big", command="x", gpus_per_shard=8, shards_per_replica=2)

    placement = explain_placement(state, spec).placement

    assert placement is not None
    assert [(s.index, s.node_id) for s in placement] == [(0, "gpu-1"), (1, "gpu-2")]


def test_the_summary_counts_each_node_once_under_the_first_check_it_fails() -> None:
    """It counted reasons: "0 eligible of 2: 1 draining, 2 not enough healthy free GPUs"
    added up to three of two nodes."""
    state = replay(
        log_of(
            NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(1)),
            NodeDrainRequested(node_id="gpu-1", drain_id="drain-1", grace_s=60),
            NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(1)),
            NodeConnected(node_id="gpu-3", address="127.0.0.3", gpus=gpus(8)),
            NodeDisconnected(node_id="gpu-3", reason="heartbeat timeout"),
            NodeCordoned(node_id="gpu-3", reason="bad fan"),
        )
    )
    spec = ModelSpec(name="m", command="x", gpus_per_shard=2)

    explanation = explain_placement(state, spec)

    assert explanation.summary == (
        "needs 1 node(s) with 2 healthy free GPU(s), 0 eligible of 3: 1 not connected, "
        "1 draining, 1 not enough healthy free GPUs; each node counted once, under the first "
        "check it fails"
    )
    # Every reason of each node is still explained.
    assert [len(c.reasons) for c in explanation.candidates] == [2, 1, 2]


def test_the_summary_of_nodes_that_each_fail_one_check_needs_no_word_on_counting() -> None:
    state = replay(
        log_of(
            NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(1)),
            NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(8)),
            NodeCordoned(node_id="gpu-2", reason="bad fan"),
        )
    )
    spec = ModelSpec(name="m", command="x", gpus_per_shard=2)

    assert explain_placement(state, spec).summary == (
        "needs 1 node(s) with 2 healthy free GPU(s), 0 eligible of 2: 1 cordoned, "
        "1 not enough healthy free GPUs"
    )


SMALL = ModelSpec(name="tall", command="vllm serve --port {port}", gpus_per_shard=1)


def _held_port_log(*, port_range: tuple[int, int], held: bool = True) -> list[AnyEvent]:
    """``tall-1`` placed on gpu-1 at the first port of ``port_range`` failed, its agent
    having found another process listening there (``held``) or not."""
    return [
        NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(2), port_range=port_range),
        ModelDeclared(model="tall", spec=SMALL),
        ReplicaPlaced(
            replica_id="tall-1",
            model="tall",
            number=1,
            shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=port_range[0]),),
        ),
        ShardFailed(
            replica_id="tall-1",
            shard_index=0,
            node_id="gpu-1",
            error=f"port {port_range[0]} is held by pid 4242, not our engine (pid 4242: nc)",
            port_held_elsewhere=held,
        ),
        ReplicaFailed(replica_id="tall-1", reason="shard 0 failed"),
    ]


def test_a_port_another_process_holds_is_skipped_and_the_explanation_says_why() -> None:
    state = replay(log_of(*_held_port_log(port_range=(30700, 30799))))

    explanation = explain_placement(state, SMALL)
    placer = Placer(state, SMALL, Allocations.for_placement(state, NOTHING_REPORTED))

    assert explanation.placement is not None
    assert explanation.placement[0].port == 30701
    assert explanation.candidates[0].ports_skipped == (30700,)
    assert "port 30700 skipped: held by a process that is not our engine" in (explanation.summary)
    replacement = placer.place("tall-2")
    assert replacement is not None
    assert replacement[0].port == 30701


def test_a_port_that_failed_for_another_reason_is_placed_again() -> None:
    state = replay(log_of(*_held_port_log(port_range=(30700, 30799), held=False)))

    explanation = explain_placement(state, SMALL)

    assert explanation.placement is not None
    assert explanation.placement[0].port == 30700
    assert explanation.candidates[0].ports_skipped == ()


def test_a_node_whose_only_port_is_held_gives_way_to_another_node() -> None:
    state = replay(
        log_of(
            *_held_port_log(port_range=(30700, 30700)),
            NodeConnected(node_id="gpu-2", address="127.0.0.2", gpus=gpus(2)),
        )
    )

    explanation = explain_placement(state, SMALL)
    reasons = {c.node_id: c.reasons for c in explanation.candidates}

    assert explanation.placement is not None
    assert explanation.placement[0].node_id == "gpu-2"
    assert reasons["gpu-1"] == (
        "no free port in 30700-30700 "
        "(port 30700 skipped: held by a process that is not our engine)",
    )


def test_the_nodes_next_hello_makes_a_held_port_placeable_again() -> None:
    state = replay(
        log_of(
            *_held_port_log(port_range=(30700, 30799)),
            NodeConnected(
                node_id="gpu-1", address="127.0.0.1", gpus=gpus(2), port_range=(30700, 30799)
            ),
        )
    )

    explanation = explain_placement(state, SMALL)

    assert explanation.placement is not None
    assert explanation.placement[0].port == 30700
