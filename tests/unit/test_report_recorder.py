"""The report recorder on the in-memory store: what agents say, as the log records it."""

from __future__ import annotations

from app.domain.events import GpuMarkedUnhealthy, GpuRecovered, event_type, node_stream
from app.domain.gpu_flaps import FlapPolicy
from app.domain.reports import AgentReport
from app.hub.edge import report_of
from app.hub.session import AgentHeartbeat, AgentHello
from app.services.agent_reports import ReportRecorder
from app.store.memory import InMemoryEventStore
from wire.messages import PROTOCOL_VERSION, GpuHealthChange, GpuReport, Heartbeat, Hello

NODE = "gpu-1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hello(healthy: bool = True) -> AgentReport:
    gpu = GpuReport(
        index=0,
        uuid="GPU-0",
        name="H100",
        memory_total_mib=81559,
        memory_used_mib=0,
        healthy=healthy,
        unhealthy_reason=None if healthy else "xid 79",
    )
    message = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=NODE,
        agent_version="t",
        address="127.0.0.1",
        port_range=(20000, 20999),
        gpus=(gpu,),
    )
    return report_of(AgentHello(node_id=NODE, hello=message, remote_address="127.0.0.1:5000"))


def heartbeat(seq: int, healthy: bool | None = None) -> AgentReport:
    changes = (
        ()
        if healthy is None
        else (GpuHealthChange(index=0, uuid="GPU-0", healthy=healthy, reason="xid 79"),)
    )
    return report_of(
        AgentHeartbeat(node_id=NODE, heartbeat=Heartbeat(seq=seq, gpu_changes=changes))
    )


async def gpu_events(store: InMemoryEventStore) -> list[str]:
    return [
        event_type(r.event)
        for r in await store.read_stream(node_stream(NODE))
        if isinstance(r.event, GpuMarkedUnhealthy | GpuRecovered)
    ]


async def test_a_gpu_flipping_170_times_is_recorded_a_handful_of_times_then_held() -> None:
    store, clock = InMemoryEventStore(), Clock()
    service = ReportRecorder(
        store, clock=clock, flap_policy=FlapPolicy(window_s=10, max_changes=3, stable_s=30)
    )
    await service.handle(hello())

    for seq in range(170):
        clock.now = seq / 170
        await service.handle(heartbeat(seq, healthy=seq % 2 == 1))

    assert await gpu_events(store) == [
        "gpu_marked_unhealthy",
        "gpu_recovered",
        "gpu_marked_unhealthy",
        "gpu_marked_unhealthy",  # the same health, now held: the reason says flapping
    ]
    [gpu] = store.state.nodes[NODE].gpus
    assert not gpu.healthy
    assert str(gpu.unhealthy_reason).startswith("flapping")

    await service.handle(hello(healthy=True))  # reconnecting does not clear the hold
    assert not store.state.nodes[NODE].gpus[0].healthy

    clock.now = 40.0
    await service.handle(heartbeat(999))  # a plain heartbeat, once stable
    assert (await gpu_events(store))[-1] == "gpu_recovered"
    assert store.state.nodes[NODE].gpus[0].healthy
