"""The agent says a GPU's used memory again when it moved notably since it last said it."""

from __future__ import annotations

from dataclasses import replace

from agent.gpu_reports import MemoryReadings
from agent.gpus import GpuStatus
from wire.messages import GPU_MEMORY_CHANGE_MIB, GpuMemoryReading

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
