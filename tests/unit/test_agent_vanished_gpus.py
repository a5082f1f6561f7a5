"""A GPU that drops out of the listing is known by its UUID, so the hellos after a driver
reload that renumbered the GPUs are ones the control plane accepts.

NVML numbers GPUs in the order it finds them: once one falls off the bus and the driver is
reloaded, the others can come back under other indexes. The agent runs as it does on a
node (its GPU source scripted), and says hello over a real WebSocket to a control plane
that checks the hello as the hub does.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path

from structlog.testing import capture_logs
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

import agent
from agent.config import AgentConfig
from agent.config_values import ServerAddress
from agent.gpu_reports import VANISHED_GPU_REASON, with_vanished_gpus
from agent.gpus import GpuSnapshot, GpuStatus
from agent.runtime import AgentRuntime
from app.hub.claims import inventory_refusal
from wire.messages import MAX_MESSAGE_BYTES, Hello, decode_from_agent


def a_gpu(index: int, uuid: str) -> GpuStatus:
    return GpuStatus(
        index=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
        memory_used_mib=0,
    )


class ScriptedGpus:
    """A GPU source that lists what the test says it lists now."""

    def __init__(self, *gpus: GpuStatus) -> None:
        self.gpus = gpus

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(gpus=self.gpus)

    def close(self) -> None:
        pass


def a_config(state_dir: Path) -> AgentConfig:
    return AgentConfig(
        servers=(ServerAddress("wss://cp:8443", "cp", 8443),),
        node_id="gpu-07",
        cert=state_dir / "node.crt",
        key=state_dir / "node.key",
        ca=state_dir / "ca.crt",
        fake_gpus=None,
        state_dir=state_dir,
        labels={},
        address="127.0.0.1",
        port_range=(20000, 20999),
        log_level="info",
    )


async def hello_of(runtime: AgentRuntime) -> Hello:
    """The hello ``runtime`` says on a new connection, as the control plane decodes it."""
    hellos: list[Hello] = []

    async def control_plane(websocket: ServerConnection) -> None:
        try:
            message = decode_from_agent(await websocket.recv())
            assert isinstance(message, Hello)
            hellos.append(message)
            await websocket.close()
        except ConnectionClosed:
            pass

    async with serve(control_plane, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", max_size=MAX_MESSAGE_BYTES) as websocket:
            await runtime.serve(websocket)
    [hello] = hellos
    return hello


def listed(hello: Hello) -> list[tuple[int, str, bool, str | None]]:
    return [(gpu.index, gpu.uuid, gpu.healthy, gpu.unhealthy_reason) for gpu in hello.gpus]


async def test_a_gpu_back_under_another_index_is_listed_once_healthy(tmp_path: Path) -> None:
    """GPU-b falls off the bus; once the driver is reloaded NVML lists it again, as GPU 2.
    It is the same GPU: not vanished any more, and not in the hello twice (a hello that
    lists a UUID twice is refused, so the node could not connect again)."""
    source = ScriptedGpus(a_gpu(0, "GPU-a"), a_gpu(1, "GPU-b"))
    runtime = AgentRuntime(a_config(tmp_path), source)
    await runtime.start()
    try:
        source.gpus = (a_gpu(0, "GPU-a"),)
        await runtime.refresh_gpus()
        lost = await hello_of(runtime)
        assert listed(lost) == [
            (0, "GPU-a", True, None),
            (1, "GPU-b", False, VANISHED_GPU_REASON),
        ]

        source.gpus = (a_gpu(0, "GPU-a"), a_gpu(2, "GPU-b"))
        await runtime.refresh_gpus()
        back = await hello_of(runtime)
    finally:
        await runtime.close()

    assert inventory_refusal(back) is None
    assert listed(back) == [(0, "GPU-a", True, None), (2, "GPU-b", True, None)]


async def test_a_vanished_gpu_whose_index_another_gpu_took_is_left_out_of_the_hello(
    tmp_path: Path,
) -> None:
    """GPU-b falls off the bus and the driver is reloaded: GPU-c, listed as 2 before, is
    now GPU 1. GPU 1 is GPU-c's now, so GPU-b cannot be listed under it (a hello that lists
    an index twice is refused); it is left out of the hello, saying so in the log, and
    GPU-c is listed once."""
    source = ScriptedGpus(a_gpu(0, "GPU-a"), a_gpu(1, "GPU-b"), a_gpu(2, "GPU-c"))
    runtime = AgentRuntime(a_config(tmp_path), source)
    await runtime.start()
    try:
        source.gpus = (a_gpu(0, "GPU-a"), a_gpu(2, "GPU-c"))
        await runtime.refresh_gpus()
        source.gpus = (a_gpu(0, "GPU-a"), a_gpu(1, "GPU-c"))
        with capture_logs() as logs:
            await runtime.refresh_gpus()
        hello = await hello_of(runtime)
    finally:
        await runtime.close()

    assert inventory_refusal(hello) is None
    assert listed(hello) == [(0, "GPU-a", True, None), (1, "GPU-c", True, None)]
    [left_out] = [line for line in logs if line["event"] == "vanished_gpu_left_out"]
    assert (left_out["gpu"], left_out["uuid"], left_out["index_now_of"]) == (1, "GPU-b", "GPU-c")


def test_a_gpu_without_a_uuid_is_known_by_its_index() -> None:
    """A GPU that could never be read has no UUID: it is listed again when its index is."""
    unread = GpuSnapshot(gpus=(a_gpu(0, "GPU-a"), a_gpu(1, "")))

    gone = with_vanished_gpus(unread, GpuSnapshot(gpus=(a_gpu(0, "GPU-a"),)))
    back = with_vanished_gpus(gone, unread)

    assert [(gpu.index, gpu.healthy) for gpu in gone.gpus] == [(0, True), (1, False)]
    assert back == unread


async def test_gpu_health_changes_while_disconnected_are_not_kept_for_a_hello_that_says_them(
    tmp_path: Path,
) -> None:
    """The next hello lists every GPU's health as it is then: a GPU that flaps all the time
    the control plane is away (hours, days) must not pile up its changes until then."""
    source = ScriptedGpus(a_gpu(0, "GPU-a"))
    runtime = AgentRuntime(a_config(tmp_path), source)
    await runtime.start()
    flapping = dataclasses.replace(a_gpu(0, "GPU-a"), healthy=False, unhealthy_reason="xid 79")
    try:
        with capture_logs():
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                for flip in range(5000):
                    source.gpus = (flapping if flip % 2 == 0 else a_gpu(0, "GPU-a"),)
                    await runtime.refresh_gpus()
                after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
        agent_files = [tracemalloc.Filter(True, f"{Path(agent.__file__).parent}/*")]
        grown = sum(
            stat.size_diff
            for stat in after.filter_traces(agent_files).compare_to(
                before.filter_traces(agent_files), "filename"
            )
        )
        source.gpus = (flapping,)
        await runtime.refresh_gpus()
        hello = await hello_of(runtime)
    finally:
        await runtime.close()

    assert grown < 50_000, f"{grown} bytes kept for 5000 changes no heartbeat will carry"
    assert listed(hello) == [(0, "GPU-a", False, "xid 79")]
