"""Placement reads a GPU's used memory as its node last reported it, not as its hello did.

The hello's figure goes stale: a hello said while an engine ran counts that engine's memory
after it stopped, and memory another process takes after the hello goes unseen. Heartbeats
carry the readings that changed (``HeartbeatReport.gpu_memory``) into the live view, and
placement reads them from there."""

from __future__ import annotations

from app.domain.events import (
    GpuInfo,
    ModelDeclared,
    NodeConnected,
    ReplicaPlaced,
    ReplicaStopped,
    ShardPlacement,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.placement import explain_placement
from app.domain.reports import (
    AgentConnected,
    AgentInventory,
    FleetView,
    HeartbeatReport,
    observe,
)
from tests.unit.test_fold import log_of

NODE = "gpu-1"
H100 = 81559  # MiB, as NVML reports an H100 80GB
ENGINE_MIB = 78_000
SPEC = ModelSpec(
    name="llama-8b", command="vllm serve --port {port}", gpus_per_shard=1, gpu_memory_gib=20
)


def gpu(used_mib: int) -> GpuInfo:
    return GpuInfo(
        index=0, uuid="GPU-0", name="H100", memory_total_mib=H100, memory_used_mib=used_mib
    )


def hello(used_mib: int) -> AgentConnected:
    inventory = AgentInventory(
        node_id=NODE,
        address="127.0.0.1",
        remote_address="127.0.0.1:4000",
        labels={},
        gpus=(gpu(used_mib),),
        port_range=(20000, 20999),
        agent_version="t",
    )
    return AgentConnected(inventory=inventory)


def reading(used_mib: int) -> HeartbeatReport:
    return HeartbeatReport(node_id=NODE, gpu_memory=((0, used_mib),))


def view_of(*reports: AgentConnected | HeartbeatReport) -> FleetView:
    view = FleetView()
    for report in reports:
        view = observe(view, report, lambda _: None)
    return view


def test_a_gpu_whose_engine_stopped_after_the_hello_is_placeable_once_its_node_says_so() -> None:
    # The agent said hello while the old replica's engine filled GPU 0, then stopped it.
    state = replay(
        log_of(
            ModelDeclared(model=SPEC.name, spec=SPEC),
            NodeConnected(node_id=NODE, address="127.0.0.1", gpus=(gpu(ENGINE_MIB),)),
            ReplicaPlaced(
                replica_id="llama-8b-1",
                model=SPEC.name,
                number=1,
                shards=(ShardPlacement(index=0, node_id=NODE, gpus=(0,), port=20000),),
            ),
            ReplicaStopped(replica_id="llama-8b-1"),
        )
    )
    stale = view_of(hello(ENGINE_MIB))
    freed = view_of(hello(ENGINE_MIB), reading(600))

    refused = explain_placement(state, SPEC, running=stale.reports)
    placed = explain_placement(state, SPEC, running=freed.reports)

    assert refused.placement is None
    assert placed.placement is not None
    assert placed.placement[0].gpus == (0,)


def test_memory_taken_after_the_hello_makes_placement_refuse_the_gpu_and_freed_allows_it() -> None:
    state = replay(
        log_of(
            ModelDeclared(model=SPEC.name, spec=SPEC),
            NodeConnected(node_id=NODE, address="127.0.0.1", gpus=(gpu(0),)),
        )
    )
    taken = view_of(hello(0), reading(70_000))
    freed = view_of(hello(0), reading(70_000), reading(0))

    refused = explain_placement(state, SPEC, running=taken.reports)
    placed = explain_placement(state, SPEC, running=freed.reports)

    (candidate,) = refused.candidates
    assert candidate.reasons == (
        "needs 1 healthy GPU(s) with 20 GiB free, has 0: GPU 0 has 11 GiB free",
    )
    assert refused.placement is None
    assert placed.placement is not None


def test_a_heartbeat_keeps_the_readings_it_does_not_repeat_and_a_hello_forgets_them() -> None:
    view = view_of(hello(0), reading(70_000))
    quiet = observe(view, HeartbeatReport(node_id=NODE), lambda _: None)
    again = observe(quiet, hello(0), lambda _: None)

    assert quiet.reports[NODE].gpu_memory_used_mib == {0: 70_000}
    assert again.reports[NODE].gpu_memory_used_mib == {}


def test_without_a_reading_placement_goes_by_the_hello() -> None:
    state = replay(
        log_of(
            ModelDeclared(model=SPEC.name, spec=SPEC),
            NodeConnected(node_id=NODE, address="127.0.0.1", gpus=(gpu(70_000),)),
        )
    )

    explanation = explain_placement(state, SPEC, running=view_of(hello(70_000)).reports)

    assert explanation.placement is None
