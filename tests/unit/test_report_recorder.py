"""The report recorder on the in-memory store: what agents say, as the log records it."""

from __future__ import annotations

import asyncio

from app.domain.events import GpuMarkedUnhealthy, GpuRecovered, event_type, node_stream
from app.domain.gpu_flaps import FlapPolicy
from app.domain.reports import AgentReport, IdentityClaim
from app.hub.edge import report_of
from app.hub.session import AgentGone, AgentHeartbeat, AgentHello
from app.services.agent_reports import ReportRecorder
from app.store.memory import InMemoryEventStore
from wire.messages import PROTOCOL_VERSION, GpuHealthChange, GpuReport, Heartbeat, Hello

NODE = "gpu-1"
POLICY = FlapPolicy(window_s=10, max_changes=3, stable_s=30)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hello(
    healthy: bool = True, *, node_id: str = NODE, gpus: tuple[str, ...] = ("GPU-0",)
) -> AgentReport:
    reports = tuple(
        GpuReport(
            index=index,
            uuid=uuid,
            name="H100",
            memory_total_mib=81559,
            memory_used_mib=0,
            healthy=healthy,
            unhealthy_reason=None if healthy else "xid 79",
        )
        for index, uuid in enumerate(gpus)
    )
    message = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id,
        agent_version="t",
        address="127.0.0.1",
        port_range=(20000, 20999),
        gpus=reports,
    )
    return report_of(AgentHello(node_id=node_id, hello=message, remote_address="127.0.0.1:5000"))


def heartbeat(
    seq: int, healthy: bool | None = None, *, node_id: str = NODE, uuid: str = "GPU-0"
) -> AgentReport:
    changes = (
        ()
        if healthy is None
        else (GpuHealthChange(index=0, uuid=uuid, healthy=healthy, reason="xid 79"),)
    )
    return report_of(
        AgentHeartbeat(node_id=node_id, heartbeat=Heartbeat(seq=seq, gpu_changes=changes))
    )


def gone(node_id: str = NODE) -> AgentReport:
    return report_of(AgentGone(node_id=node_id, reason="connection lost"))


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


async def test_a_gpu_the_node_stopped_listing_is_forgotten_hold_and_all() -> None:
    """GPU 0 flaps and is held; the node's next hello lists another GPU (the board was
    swapped, or the node lied before). Before, the hold stayed on index 0 for as long as the
    control plane ran: the new GPU 0 was recorded unhealthy, "flapping", at once."""
    store, clock = InMemoryEventStore(), Clock()
    service = ReportRecorder(store, clock=clock, flap_policy=POLICY)
    await service.handle(hello())
    for seq in range(10):
        clock.now = seq / 10
        await service.handle(heartbeat(seq, healthy=seq % 2 == 1))
    assert str(store.state.nodes[NODE].gpus[0].unhealthy_reason).startswith("flapping")

    await service.handle(hello(gpus=()))  # GPU 0 gone
    await service.handle(hello(gpus=("GPU-new",)))  # a GPU 0 again, healthy

    [gpu] = store.state.nodes[NODE].gpus
    assert (gpu.uuid, gpu.healthy, gpu.unhealthy_reason) == ("GPU-new", True, None)


async def test_a_held_gpu_numbered_anew_stays_held_and_the_gpu_under_its_old_index_is_not() -> None:
    """GPU 0 flaps and is held; after a driver reload the node's next hello lists it under
    index 1, and another GPU under index 0. Before, the hold stayed on index 0: the other
    GPU was recorded unhealthy, "flapping", and the flapping one was judged afresh."""
    store, clock = InMemoryEventStore(), Clock()
    service = ReportRecorder(store, clock=clock, flap_policy=POLICY)
    await service.handle(hello())
    for seq in range(10):
        clock.now = seq / 10
        await service.handle(heartbeat(seq, healthy=seq % 2 == 1))

    await service.handle(hello(gpus=("GPU-new", "GPU-0")))

    newcomer, moved = store.state.nodes[NODE].gpus
    assert (newcomer.uuid, newcomer.healthy, newcomer.unhealthy_reason) == ("GPU-new", True, None)
    assert (moved.uuid, moved.healthy) == ("GPU-0", False)
    assert str(moved.unhealthy_reason).startswith("flapping")


async def test_the_flap_guards_forget_nodes_gone_once_nothing_they_remember_matters() -> None:
    """A hold matters while its GPU may still flap; a node away for longer than the flap
    window and the stable period is judged afresh when it comes back (a hold would be
    released at its first heartbeat then anyway). So what is remembered is bounded by the
    nodes connected and those gone recently, each by the GPUs its hello listed."""
    store, clock = InMemoryEventStore(), Clock()
    service = ReportRecorder(store, clock=clock, flap_policy=POLICY)
    nodes = [f"gpu-{n}" for n in range(50)]
    for node in nodes:
        await service.handle(hello(node_id=node, gpus=("GPU-0", "GPU-1")))
        for seq in range(10):
            await service.handle(heartbeat(seq, healthy=seq % 2 == 1, node_id=node))
    assert service.remembered_gpus() == 100

    for node in nodes[1:]:
        await service.handle(gone(node))
    clock.now = POLICY.stable_s - 1
    await service.handle(heartbeat(99, node_id=nodes[0]))
    assert service.remembered_gpus() == 100, "gone, but a hold still matters"

    clock.now = POLICY.stable_s + POLICY.window_s + 1
    await service.handle(heartbeat(100, node_id=nodes[0]))
    assert service.remembered_gpus() == 2, "the connected node's two GPUs"

    await service.handle(hello(node_id=nodes[1], gpus=("GPU-0",)))  # back: judged afresh
    [gpu] = store.state.nodes[nodes[1]].gpus
    assert gpu.healthy


async def test_no_node_keeps_a_turn_once_its_reports_are_recorded() -> None:
    """Node ids come from connections, and a claimed one from a connection that could not
    prove it: a turn kept per id for ever would grow with every name ever claimed."""
    store = InMemoryEventStore()
    service = ReportRecorder(store, clock=Clock(), flap_policy=POLICY)
    claims = [
        IdentityClaim(
            claimed_node_id=f"claimed-{n}",
            certificate_subject="CN=gpu-1",
            remote_address="127.0.0.1:5000",
            reason="the certificate names gpu-1",
        )
        for n in range(2000)
    ]
    await asyncio.gather(*(service.handle(claim) for claim in claims))
    for n in range(50):
        await service.handle(hello(node_id=f"node-{n}"))
        await service.handle(gone(node_id=f"node-{n}"))
    assert len(await store.read_stream(node_stream("claimed-1999"))) == 1
    assert service.nodes_in_turn() == 0


async def test_one_nodes_reports_are_still_recorded_one_at_a_time_in_order() -> None:
    store = InMemoryEventStore()
    service = ReportRecorder(store, clock=Clock(), flap_policy=POLICY)
    await asyncio.gather(service.handle(hello()), service.handle(gone()), service.handle(hello()))
    recorded = [event_type(r.event) for r in await store.read_stream(node_stream(NODE))]
    assert recorded[-3:] == ["node_connected", "node_disconnected", "node_connected"], recorded
    assert service.nodes_in_turn() == 0
