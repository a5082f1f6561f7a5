"""The agent says a GPU's used memory again when it moved notably since it last said it, reads
its GPUs again as soon as shards end, and fake GPUs use what ``llmgw-agent fake-gpu use``
writes."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from agent.command_line import EXIT_OK, EXIT_USAGE
from agent.gpu_reports import MemoryReadings
from agent.gpus import FakeGpuSource, GpuSnapshot, GpuStatus, open_gpu_source, parse_fake_gpus
from agent.gpus.fake_health import declare_fake_gpus
from agent.gpus.fake_memory import (
    MAX_FAKE_USED_MIB,
    memory_file_beside,
    read_memory_file,
    use_fake_gpu_memory,
)
from agent.main import app
from agent.runtime import AgentRuntime
from tests.support.waiting import wait_until
from tests.unit.test_agent_vanished_gpus import a_config
from wire.messages import (
    GPU_MEMORY_CHANGE_MIB,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    GpuMemoryReading,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Welcome,
    decode_from_agent,
    encode,
)

TOTAL = 81920


def a_gpu(index: int, used_mib: int, uuid: str = "") -> GpuStatus:
    return GpuStatus(
        index=index,
        uuid=uuid or f"GPU-{index}",
        name="llmgw fake GPU 80GB",
        memory_total_mib=TOTAL,
        memory_used_mib=used_mib,
    )


def test_a_reading_goes_out_once_it_moved_by_the_threshold_from_what_was_last_said() -> None:
    readings = MemoryReadings()
    readings.said([a_gpu(0, 0), a_gpu(1, 40_000)])

    small = readings.changed([a_gpu(0, GPU_MEMORY_CHANGE_MIB - 1), a_gpu(1, 40_000)])
    taken = readings.changed([a_gpu(0, 30_000), a_gpu(1, 40_000)])
    unchanged = readings.changed([a_gpu(0, 30_000), a_gpu(1, 40_000)])
    freed = readings.changed([a_gpu(0, 30_000), a_gpu(1, 500)])

    assert small == ()
    assert taken == (GpuMemoryReading(index=0, uuid="GPU-0", used_mib=30_000),)
    assert unchanged == (), "said once, not with every heartbeat"
    assert freed == (GpuMemoryReading(index=1, uuid="GPU-1", used_mib=500),)


def test_small_drifts_add_up_to_a_reading_against_what_was_said_not_the_last_snapshot() -> None:
    readings = MemoryReadings()
    readings.said([a_gpu(0, 0)])
    step = GPU_MEMORY_CHANGE_MIB // 2

    drifted = [readings.changed([a_gpu(0, step * n)]) for n in (1, 2)]

    assert drifted == [(), (GpuMemoryReading(index=0, uuid="GPU-0", used_mib=step * 2),)]


def test_only_gpus_the_hello_listed_are_read_and_a_gpu_not_listed_any_more_is_not() -> None:
    readings = MemoryReadings()
    readings.said([a_gpu(0, 0)])

    changed = readings.changed(
        [
            replace(a_gpu(0, 30_000), listed=False),
            a_gpu(1, 30_000),
        ]
    )
    swapped = readings.changed([a_gpu(0, 30_000, uuid="GPU-other")])

    assert (changed, swapped) == ((), ())


def test_before_any_hello_nothing_is_read() -> None:
    assert MemoryReadings().changed([a_gpu(0, 30_000)]) == ()


# -- reading again when shards end -----------------------------------------------------------


class CountedGpu:
    """One GPU whose used memory the test sets, counting the agent's reads of it."""

    def __init__(self, used_mib: int) -> None:
        self.used_mib = used_mib
        self.reads = 0

    def snapshot(self) -> GpuSnapshot:
        self.reads += 1
        return GpuSnapshot(gpus=(a_gpu(0, self.used_mib),))

    def close(self) -> None:
        pass


class ControlPlane:
    """Welcomes one agent over a real WebSocket and keeps the heartbeats it sends."""

    def __init__(self) -> None:
        self.hellos: list[Hello] = []
        self.heartbeats: list[Heartbeat] = []

    async def handle(self, websocket: ServerConnection) -> None:
        try:
            hello = decode_from_agent(await websocket.recv())
            assert isinstance(hello, Hello)
            self.hellos.append(hello)
            welcome = Welcome(
                protocol_version=PROTOCOL_VERSION,
                heartbeat_interval_s=0.5,
                server_id="cp",
                epoch=1,
            )
            await websocket.send(encode(welcome), text=True)
            async for frame in websocket:
                message = decode_from_agent(frame)
                if isinstance(message, Heartbeat):
                    self.heartbeats.append(message)
                    await websocket.send(encode(HeartbeatAck(seq=message.seq)), text=True)
        except ConnectionClosed:
            pass

    def memory_said(self) -> list[GpuMemoryReading]:
        return [reading for beat in self.heartbeats for reading in beat.gpu_memory]


async def test_shards_that_end_have_their_gpu_read_once_for_the_next_heartbeat(
    tmp_path: Path,
) -> None:
    """Eight engines on GPU 0 stop at once (a drain): the next heartbeat says the memory they
    freed, without waiting for the next poll (an hour here), and the eight stops cost one
    read of the GPUs, not eight."""
    gpu = CountedGpu(used_mib=60_000)
    runtime = AgentRuntime(a_config(tmp_path), gpu, gpu_poll_interval_s=3600)
    control_plane = ControlPlane()
    await runtime.start()
    watching = asyncio.create_task(runtime.watch_gpus())
    try:
        async with serve(control_plane.handle, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with connect(f"ws://127.0.0.1:{port}", max_size=MAX_MESSAGE_BYTES) as ws:
                serving = asyncio.create_task(runtime.serve(ws))
                await wait_until(lambda: bool(control_plane.heartbeats), what="a heartbeat")
                assert control_plane.hellos[0].gpus[0].memory_used_mib == 60_000
                reads_before = gpu.reads

                gpu.used_mib = 0
                await asyncio.gather(
                    *(runtime.supervisor.stop(f"llama-{n}", 0, grace_s=1) for n in range(8))
                )
                await wait_until(
                    lambda: bool(control_plane.memory_said()), what="a heartbeat saying 0 MiB"
                )
                await runtime.refresh_gpus()  # after any read still waiting for the lock
                reads_for_the_stops = gpu.reads - reads_before - 1

                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await runtime.close()

    assert control_plane.memory_said() == [GpuMemoryReading(index=0, uuid="GPU-0", used_mib=0)]
    assert reads_for_the_stops == 1


# -- fake GPUs -------------------------------------------------------------------------------


def test_a_fake_gpu_uses_what_the_memory_file_says_and_frees_it_when_told(
    tmp_path: Path,
) -> None:
    health_file = tmp_path / "fake-gpu-health.json"
    declare_fake_gpus(health_file, 2)
    source = FakeGpuSource(parse_fake_gpus("2x80GB", seed="n"), health_file)
    memory_file = memory_file_beside(health_file)

    use_fake_gpu_memory(memory_file, 0, 30_000)
    taken = source.snapshot()
    use_fake_gpu_memory(memory_file, 0, 0)
    freed = source.snapshot()

    assert [g.memory_used_mib for g in taken.gpus] == [30_000, 0]
    assert [g.memory_used_mib for g in freed.gpus] == [0, 0]
    assert json.loads(memory_file.read_text()) == {}


def test_a_memory_file_written_by_hand_keeps_only_what_can_be_true(tmp_path: Path) -> None:
    health_file = tmp_path / "fake-gpu-health.json"
    source = FakeGpuSource(parse_fake_gpus("2x80GB", seed="n"), health_file)
    memory_file = memory_file_beside(health_file)
    memory_file.write_text(
        json.dumps({"0": 90_000, "1": 1_000, "7": 5, "x": 1, "2": -4, "3": 1.5, "4": True})
    )

    snapshot = source.snapshot()
    problems = read_memory_file(memory_file).problems

    assert [g.memory_used_mib for g in snapshot.gpus] == [0, 1_000], "more than it has: ignored"
    assert len(problems) == 4  # "x", -4, 1.5 and true


@pytest.mark.parametrize("content", ["not json", "[1, 2]", "\xff"])
def test_a_memory_file_that_is_not_ours_uses_nothing_and_never_raises(
    tmp_path: Path, content: str
) -> None:
    health_file = tmp_path / "fake-gpu-health.json"
    source = FakeGpuSource(parse_fake_gpus("1x80GB", seed="n"), health_file)
    memory_file_beside(health_file).write_bytes(content.encode("latin-1"))

    assert [g.memory_used_mib for g in source.snapshot().gpus] == [0]


def test_using_memory_of_a_gpu_the_node_lacks_or_more_than_any_gpu_has_is_refused(
    tmp_path: Path,
) -> None:
    health_file = tmp_path / "fake-gpu-health.json"
    declare_fake_gpus(health_file, 2)
    memory_file = memory_file_beside(health_file)

    with pytest.raises(ValueError, match=r"--gpu 2: the agent has 2 fake GPU\(s\)"):
        use_fake_gpu_memory(memory_file, 2, 1_000)
    with pytest.raises(ValueError, match=rf"--mib {MAX_FAKE_USED_MIB + 1}: MiB used is 0 to"):
        use_fake_gpu_memory(memory_file, 0, MAX_FAKE_USED_MIB + 1)
    assert not memory_file.exists()


def test_fake_gpu_use_writes_the_memory_file_the_agent_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    declare_fake_gpus(tmp_path / "fake-gpu-health.json", 2)

    use = ["fake-gpu", "use", "--state-dir", str(tmp_path), "--gpu", "1", "--mib"]

    used = app([*use, "30000"], result_action="return_value")
    refused = app([*use, "-5"], result_action="return_value")

    assert used == EXIT_OK
    assert json.loads((tmp_path / "fake-gpu-memory.json").read_text()) == {"1": 30000}
    assert refused == EXIT_USAGE
    assert capsys.readouterr().err == (
        "llmgw-agent fake-gpu use: --mib -5: MiB used is 0 or more\n"
    )


def test_fake_gpu_use_refuses_more_memory_than_the_running_agents_gpus_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, ``use --mib 90000`` on an 80 GB fake GPU wrote the entry and exited 0; the
    agent then ignored it, saying so only in its own log, and the GPU stayed unused. The
    running agent declares its fake GPUs' size beside their count, and ``use`` refuses
    what the agent would ignore, writing nothing."""
    health_file = tmp_path / "fake-gpu-health.json"
    open_gpu_source("2x80GB", health_file, node_seed="gpu-7").close()
    use = ["fake-gpu", "use", "--state-dir", str(tmp_path), "--gpu", "0", "--mib"]

    refused = app([*use, "90000"], result_action="return_value")
    used = app([*use, "81920"], result_action="return_value")

    assert refused == EXIT_USAGE
    assert capsys.readouterr().err == (
        "llmgw-agent fake-gpu use: --mib 90000: GPU 0 has 81920 MiB\n"
    )
    assert used == EXIT_OK
    assert json.loads((tmp_path / "fake-gpu-memory.json").read_text()) == {"0": 81920}
