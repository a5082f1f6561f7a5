"""Two nodes that list one GPU UUID: the node connected the longest keeps it, and the
other's GPU with that UUID takes no new shard, said so wherever placement is explained.

A UUID names one physical GPU in the fleet, yet a copied state directory, a cloned machine
or a node that lies can make two connected nodes list one. Before, nothing looked: both
GPUs were placed on, and nothing said that two nodes claimed one GPU. Later, only the
node's view and placement said it: now ``/metrics`` counts it by node, the node list names
it, and a replica already on such a GPU says so (it keeps running)."""

from __future__ import annotations

import asyncio

import msgspec
from structlog.testing import capture_logs

from app.admin.metrics import fold_families
from app.admin.nodes import node_summary, node_view
from app.admin.replicas import replica_view
from app.domain.allocation import Allocations
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    ModelDeclared,
    NodeConnected,
    NodeDisconnected,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.placement import explain_placement
from app.domain.state import ClusterState, ReplicaPhase
from app.services.agent_reports import ReportRecorder
from app.store.memory import InMemoryEventStore
from tests.unit.test_fold import log_of
from tests.unit.test_report_recorder import hello

SPEC = ModelSpec(name="llama", command="sim --port {port}", gpus_per_shard=1)
SHARED = "GPU-84bba079-31db-9253-06a0-799dc6ebd718"


def gpu(index: int, uuid: str) -> GpuInfo:
    return GpuInfo(index=index, uuid=uuid, name="H100", memory_total_mib=81559)


def connected(node_id: str, *gpus: GpuInfo, replaced_previous: bool = False) -> NodeConnected:
    number = node_id.rsplit("-", 1)[-1]
    return NodeConnected(
        node_id=node_id,
        address=f"127.0.0.{number}",
        gpus=gpus,
        replaced_previous=replaced_previous,
    )


def held_elsewhere(state: ClusterState) -> dict[str, dict[int, str]]:
    """The rule itself, imported here so that each test says what it finds missing."""
    from app.domain.gpu_claims import gpus_held_elsewhere

    return gpus_held_elsewhere(state.nodes.values())


def given(*events: AnyEvent) -> ClusterState:
    return replay(log_of(ModelDeclared(model="llama", spec=SPEC), *events))


def test_the_node_connected_first_keeps_a_uuid_and_the_other_gpu_takes_no_shard() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED), gpu(1, "GPU-1-own")),
    )

    explanation = explain_placement(state, SPEC)
    reasons = {c.node_id: c.reasons for c in explanation.candidates}
    assert reasons["gpu-2"] == ()
    [candidate] = [c for c in explanation.candidates if c.node_id == "gpu-1"]
    assert candidate.gpus == (1,), "the GPU whose UUID gpu-2 holds was offered"
    assert candidate.usable_gpus == 1
    assert held_elsewhere(state) == {"gpu-1": {0: "gpu-2"}}


def test_placement_says_which_node_holds_the_uuid() -> None:
    state = given(connected("gpu-2", gpu(0, SHARED)), connected("gpu-1", gpu(0, SHARED)))

    explanation = explain_placement(state, SPEC)

    reasons = {c.node_id: c.reasons for c in explanation.candidates}
    assert reasons["gpu-1"] == (
        f"needs 1 healthy GPU(s), has 0: GPU 0 held elsewhere (its UUID {SHARED} is listed "
        "by node gpu-2 too, connected longer)",
    )
    assert explanation.placement is not None
    assert [s.node_id for s in explanation.placement] == ["gpu-2"]


def test_the_node_view_and_summary_show_the_gpu_held_elsewhere() -> None:
    state = given(connected("gpu-2", gpu(0, SHARED)), connected("gpu-1", gpu(0, SHARED)))

    [shown] = node_view(state, "gpu-1").gpus
    summary = node_summary(state, state.nodes["gpu-1"], Allocations.from_state(state))

    assert shown.excluded_because == (
        f"held elsewhere: its UUID {SHARED} is listed by node gpu-2 too, connected longer"
    )
    assert summary.free_gpus == 0
    assert node_view(state, "gpu-2").gpus[0].excluded_because is None


def test_a_uuid_moves_once_its_node_is_gone_and_stays_when_that_node_returns() -> None:
    """A GPU moved to another machine while its old node was offline: the new node may use
    it. When the old node comes back listing it too, the node connected the longest, the new
    one, keeps it."""
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED)),
        NodeDisconnected(node_id="gpu-2", reason="heartbeat timeout"),
    )
    assert held_elsewhere(state) == {}
    assert explain_placement(state, SPEC).placement is not None

    returned = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED)),
        NodeDisconnected(node_id="gpu-2", reason="heartbeat timeout"),
        connected("gpu-2", gpu(0, SHARED)),
    )
    assert held_elsewhere(returned) == {"gpu-2": {0: "gpu-1"}}


def test_a_hello_on_a_connection_that_replaced_another_keeps_the_uuid() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED)),
        connected("gpu-2", gpu(0, SHARED), replaced_previous=True),
    )

    assert held_elsewhere(state) == {"gpu-1": {0: "gpu-2"}}


def test_gpus_without_a_uuid_are_never_held_elsewhere() -> None:
    state = given(connected("gpu-2", gpu(0, "")), connected("gpu-1", gpu(0, "")))

    assert held_elsewhere(state) == {}
    eligible = [c.node_id for c in explain_placement(state, SPEC).candidates if c.eligible]
    assert eligible == ["gpu-1", "gpu-2"]


def test_the_hello_of_a_node_listing_a_uuid_held_elsewhere_is_a_warning_once() -> None:
    recorder = ReportRecorder(InMemoryEventStore())

    async def story() -> None:
        await recorder.handle(hello(node_id="gpu-2", gpus=(SHARED,)))
        await recorder.handle(hello(node_id="gpu-1", gpus=("GPU-1-own", SHARED)))

    with capture_logs() as logs:
        asyncio.run(story())

    warnings = [line for line in logs if line["event"] == "gpu_uuid_held_elsewhere"]
    assert [(w["node_id"], w["gpus"]) for w in warnings] == [
        ("gpu-1", [f"1 ({SHARED}) held by gpu-2"])
    ]


def placed_on(node_id: str, gpu_index: int, replica_id: str = "llama-1") -> ReplicaPlaced:
    shard = ShardPlacement(index=0, node_id=node_id, gpus=(gpu_index,), port=20000)
    return ReplicaPlaced(replica_id=replica_id, model="llama", number=1, shards=(shard,))


def test_each_node_counts_its_gpus_held_elsewhere_and_every_other_node_none() -> None:
    from app.domain.gpu_claims import held_elsewhere_counts

    state = given(
        connected("gpu-2", gpu(0, SHARED), gpu(1, "GPU-2-own")),
        connected("gpu-1", gpu(0, SHARED), gpu(1, "GPU-2-own"), gpu(2, "GPU-1-own")),
        connected("gpu-3", gpu(0, "GPU-3-own")),
    )

    assert held_elsewhere_counts(state.nodes.values()) == {"gpu-1": 2, "gpu-2": 0, "gpu-3": 0}


def test_metrics_count_each_nodes_gpus_held_elsewhere_by_node_never_by_uuid() -> None:
    """An alert can fire on ``llmgw_gpus_held_elsewhere > 0``; the UUIDs a node lists, which
    it names freely, never become labels."""
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED), gpu(1, "GPU-1-own")),
        connected("gpu-3", gpu(0, "GPU-3-own")),
        NodeDisconnected(node_id="gpu-3", reason="heartbeat timeout"),
    )

    families = {f.name: f for f in fold_families(state, {})}
    held = families.get("llmgw_gpus_held_elsewhere")

    assert held is not None, "no family counts the GPUs held elsewhere"
    assert held.type == "gauge"
    assert {s.labels["node"]: s.value for s in held.samples} == {
        "gpu-1": 1,
        "gpu-2": 0,
        "gpu-3": 0,
    }
    assert all(set(s.labels) == {"node"} for s in held.samples)


def test_the_node_summary_lists_the_indexes_of_its_gpus_held_elsewhere() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, "GPU-1-own"), gpu(1, SHARED)),
    )
    allocations = Allocations.from_state(state)

    clone = msgspec.to_builtins(node_summary(state, state.nodes["gpu-1"], allocations))
    holder = msgspec.to_builtins(node_summary(state, state.nodes["gpu-2"], allocations))

    assert clone.get("held_elsewhere_gpus") == [1]
    assert holder.get("held_elsewhere_gpus") == []


def test_a_replica_on_a_gpu_held_elsewhere_says_so_and_keeps_running() -> None:
    """Two nodes claim one physical GPU: the engine may not be where its node says. It is
    neither stopped nor moved, but its view names the GPU and the node that holds it."""
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED), gpu(1, "GPU-1-own")),
        placed_on("gpu-1", 0),
        ReplicaServing(replica_id="llama-1"),
        placed_on("gpu-1", 1, "llama-2"),
    )

    [shard] = msgspec.to_builtins(replica_view(state.replicas["llama-1"], {}, None, state.nodes))[
        "shards"
    ]
    [own] = msgspec.to_builtins(replica_view(state.replicas["llama-2"], {}, None, state.nodes))[
        "shards"
    ]

    assert state.replicas["llama-1"].phase is ReplicaPhase.SERVING
    assert shard.get("gpus_held_elsewhere") == [
        {
            "index": 0,
            "uuid": SHARED,
            "held_by": "gpu-2",
            "reason": f"its UUID {SHARED} is listed by node gpu-2 too, connected longer",
        }
    ]
    assert own.get("gpus_held_elsewhere") == []


def test_an_ended_replica_says_nothing_of_gpus_held_elsewhere_now() -> None:
    """Its GPUs are no longer its: who holds their UUID now is no concern of its history."""
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED)),
        placed_on("gpu-1", 0),
        ReplicaFailed(replica_id="llama-1", reason="engine exited"),
    )

    [shard] = replica_view(state.replicas["llama-1"], {}, None, state.nodes).shards

    assert shard.gpus_held_elsewhere == []
