"""Recorded machines replayed through the NVML GPU source."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.gpus.nvml import NvmlGpuSource
from agent.gpus.recorded import RecordedNvml
from agent.gpus.types import GpuSnapshot, GpuStatus
from agent.gpus.xid import XidClass

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
H100 = "NVIDIA H100 80GB HBM3"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def replay(name: str, clock: Clock | None = None) -> tuple[NvmlGpuSource, RecordedNvml]:
    nvml = RecordedNvml.from_file(FIXTURES / name)
    return NvmlGpuSource(nvml, now=clock or Clock()), nvml


def unhealthy(snapshot: GpuSnapshot) -> dict[int, str | None]:
    return {gpu.index: gpu.unhealthy_reason for gpu in snapshot.gpus if not gpu.healthy}


def test_eight_healthy_h100s_are_listed_with_their_inventory() -> None:
    source, _ = replay("h100x8_healthy.json")

    snapshot = source.snapshot()

    assert snapshot.unavailable_reason is None
    assert [gpu.index for gpu in snapshot.gpus] == list(range(8))
    assert all(gpu.healthy and gpu.unhealthy_reason is None for gpu in snapshot.gpus)
    assert {gpu.name for gpu in snapshot.gpus} == {H100}
    assert {gpu.memory_total_mib for gpu in snapshot.gpus} == {81559}
    first = snapshot.gpus[0]
    assert first.uuid == "GPU-84bba079-31db-9253-06a0-799dc6ebd718"
    assert first.memory_used_mib == 77891158016 // 2**20
    assert snapshot.gpus[7].memory_used_mib == 530
    assert len({gpu.uuid for gpu in snapshot.gpus}) == 8
    assert snapshot.xid_events == ()


def test_retired_pages_not_supported_on_h100_is_not_a_failure() -> None:
    source, nvml = replay("h100x8_healthy.json")

    snapshot = source.snapshot()

    asked = {call.function for call in nvml.calls if call.gpu == 0}
    assert "nvmlDeviceGetRetiredPagesPendingStatus" in asked
    assert all(gpu.healthy for gpu in snapshot.gpus)


def test_consumer_gpu_without_ecc_is_healthy() -> None:
    source, nvml = replay("rtx4090_no_ecc.json")

    (gpu,) = source.snapshot().gpus

    assert gpu == GpuStatus(
        index=0,
        uuid=gpu.uuid,
        name="NVIDIA GeForce RTX 4090",
        memory_total_mib=24564,
        memory_used_mib=1228,
        healthy=True,
    )
    asked = [call.function for call in nvml.calls if call.gpu == 0]
    assert {
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTotalEccErrors",
    } <= set(asked)


def test_pending_retired_pages_make_the_gpu_unhealthy() -> None:
    source, _ = replay("v100_retired_pages_pending.json")

    snapshot = source.snapshot()

    assert unhealthy(snapshot) == {0: "retired pages pending: a GPU reset is needed to retire them"}
    assert snapshot.gpus[0].name == "Tesla V100-SXM2-32GB"


def test_row_remap_pending_holds_the_a100_until_it_is_reset() -> None:
    source, _ = replay("a100_row_remap_pending.json")

    before_reset = source.snapshot()
    after_reset = source.snapshot()

    assert unhealthy(before_reset) == {
        1: "row remapping pending: a GPU reset is needed to apply it; "
        "1 uncorrectable ECC error(s) since the last GPU reset"
    }
    assert unhealthy(after_reset) == {}
    assert after_reset.gpus[1].healthy


def test_a_lost_gpu_is_unhealthy_and_healthy_again_when_it_answers() -> None:
    source, _ = replay("a100_gpu_lost_then_back.json")

    first = source.snapshot()
    lost = source.snapshot()
    back = source.snapshot()

    assert unhealthy(first) == {}
    assert unhealthy(lost) == {2: "GPU is lost: NVML nvmlDeviceGetUUID answered 'GPU is lost'"}
    assert lost.gpus[2].uuid == first.gpus[2].uuid, "a lost GPU keeps its last known identity"
    assert lost.gpus[2].memory_total_mib == 81920
    assert unhealthy(back) == {}
    assert back.gpus == first.gpus


def test_xid_79_is_classified_and_marks_the_gpu_that_fell_off_the_bus() -> None:
    clock = Clock()
    source, _ = replay("h100x8_xid79.json", clock)

    before = source.snapshot()
    clock.advance(30)
    fallen = source.snapshot()
    clock.advance(3600)
    later = source.snapshot()

    assert unhealthy(before) == {}
    (event,) = fallen.xid_events
    assert (event.gpu_index, event.xid, event.at) == (5, 79, clock.now - timedelta(seconds=3600))
    assert event.classification is XidClass.HARDWARE
    assert event.description == "GPU has fallen off the bus"
    assert event.marks_unhealthy
    assert unhealthy(fallen) == {
        5: "XID 79: GPU has fallen off the bus; "
        "GPU is lost: NVML nvmlDeviceGetHandleByIndex answered 'Unknown Error'"
    }
    assert fallen.gpus[5].xid == 79
    assert fallen.gpus[5].uuid == before.gpus[5].uuid
    assert later.xid_events == (), "an event is reported once"
    assert 5 in unhealthy(later), "still off the bus: the XID hold outlasts its window"


def test_xid_13_is_an_application_fault_that_leaves_the_gpu_healthy() -> None:
    source, _ = replay("a100_xid13.json")

    snapshot = source.snapshot()

    (event,) = snapshot.xid_events
    assert (event.gpu_index, event.xid) == (0, 13)
    assert event.classification is XidClass.APPLICATION
    assert not event.marks_unhealthy
    assert all(gpu.healthy for gpu in snapshot.gpus)
    assert snapshot.gpus[0].memory_used_mib == 36864


def test_every_pending_event_is_drained_without_waiting() -> None:
    source, nvml = replay("a100_xid13.json")

    source.snapshot()

    waits = [call for call in nvml.calls if call.function == "nvmlEventSetWait"]
    assert len(waits) == 2, "one event, then the timeout that says the queue is empty"


@pytest.mark.parametrize("snapshots", [1, 3])
def test_a_machine_without_the_driver_reports_no_gpus_and_why(snapshots: int) -> None:
    source, nvml = replay("no_driver.json")

    for _ in range(snapshots):
        snapshot = source.snapshot()

    assert snapshot.gpus == ()
    assert snapshot.unavailable_reason == (
        "no NVML: no GPUs discovered (NVML Shared Library Not Found)"
    )
    assert [call.function for call in nvml.calls] == ["nvmlInit"] * snapshots


def test_closing_frees_the_event_set_and_shuts_nvml_down() -> None:
    source, nvml = replay("h100x8_healthy.json")
    source.snapshot()

    source.close()
    source.close()

    assert [call.function for call in nvml.calls[-2:]] == ["nvmlEventSetFree", "nvmlShutdown"]
    with pytest.raises(RuntimeError, match="closed"):
        source.snapshot()
