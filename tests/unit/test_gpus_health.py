"""Health rules of the NVML source, told with small recordings built in the test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pynvml
import pytest

from agent.gpus.health import XidHolds
from agent.gpus.nvml import NvmlGpuSource
from agent.gpus.recorded import RecordedNvml
from agent.gpus.recording import Answer, JsonValue, RaisedError, Recording
from agent.gpus.types import GpuSnapshot
from agent.gpus.xid import XidClass

WINDOW = timedelta(minutes=5)
TIMEOUT = 10


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


def ok(value: JsonValue = None) -> Answer:
    return Answer(returns=value)


def fails(code: int) -> Answer:
    return Answer(raises=RaisedError(type(pynvml.NVMLError(code)).__name__, code))


def xid(code: int, gpu: int | None = 0) -> Answer:
    device: JsonValue = None if gpu is None else {"handle": gpu}
    return ok({"device": device, "eventType": 8, "eventData": code})


def machine(gpus: int = 2) -> Recording:
    """Healthy A100s; tests change the answers they are about."""
    recording = Recording()
    recording.library.update(
        nvmlInit=[ok()],
        nvmlEventSetCreate=[ok()],
        nvmlDeviceGetCount=[ok(gpus)],
        nvmlEventSetWait=[fails(TIMEOUT)],
    )
    for index in range(gpus):
        recording.gpus[index] = {
            "nvmlDeviceGetHandleByIndex": [ok({"handle": index})],
            "nvmlDeviceGetIndex": [ok(index)],
            "nvmlDeviceRegisterEvents": [ok()],
            "nvmlDeviceGetUUID": [ok(f"GPU-0000000{index}-7f3a-2c41-9e0b-5d8a1c2e4f6b")],
            "nvmlDeviceGetName": [ok("NVIDIA A100-SXM4-80GB")],
            "nvmlDeviceGetMemoryInfo": [ok({"total": 85899345920, "free": 0, "used": 0})],
            "nvmlDeviceGetRetiredPagesPendingStatus": [fails(pynvml.NVML_ERROR_NOT_SUPPORTED)],
            "nvmlDeviceGetRemappedRows": [ok([0, 0, 0, 0])],
            "nvmlDeviceGetTotalEccErrors": [ok(0)],
        }
    return recording


def source_for(recording: Recording, clock: Clock) -> tuple[NvmlGpuSource, RecordedNvml]:
    nvml = RecordedNvml(recording)
    return NvmlGpuSource(nvml, xid_recovery=WINDOW, now=clock), nvml


def reasons(snapshot: GpuSnapshot) -> dict[int, str | None]:
    return {gpu.index: gpu.unhealthy_reason for gpu in snapshot.gpus if not gpu.healthy}


def test_a_hardware_xid_holds_the_gpu_until_the_window_passes_quietly() -> None:
    clock = Clock()
    recording = machine()
    recording.library["nvmlEventSetWait"] = [xid(48), fails(TIMEOUT)]
    source, _ = source_for(recording, clock)

    struck = source.snapshot()
    clock.advance(WINDOW - timedelta(seconds=1))
    within = source.snapshot()
    clock.advance(timedelta(seconds=1))
    recovered = source.snapshot()

    assert reasons(struck) == {0: "XID 48: double-bit ECC error"}
    assert struck.gpus[0].xid == 48
    assert reasons(within) == {0: "XID 48: double-bit ECC error"}
    assert reasons(recovered) == {}
    assert recovered.gpus[0].xid is None


def test_a_new_xid_restarts_the_window() -> None:
    clock = Clock()
    recording = machine()
    recording.library["nvmlEventSetWait"] = [xid(119), fails(TIMEOUT), xid(120), fails(TIMEOUT)]
    source, _ = source_for(recording, clock)

    source.snapshot()
    clock.advance(WINDOW / 2)
    again = source.snapshot()
    clock.advance(WINDOW / 2)
    first_window_over = source.snapshot()
    clock.advance(WINDOW / 2)
    second_window_over = source.snapshot()

    assert reasons(again) == {0: "XID 120: GSP error"}
    assert reasons(first_window_over) == {0: "XID 120: GSP error"}
    assert reasons(second_window_over) == {}


def test_the_hold_stays_while_other_checks_fail_and_ends_when_a_reset_clears_them() -> None:
    clock = Clock()
    recording = machine()
    recording.library["nvmlEventSetWait"] = [xid(94), fails(TIMEOUT)]
    recording.gpus[0]["nvmlDeviceGetTotalEccErrors"] = [ok(1), ok(1), ok(0)]
    source, _ = source_for(recording, clock)

    source.snapshot()
    clock.advance(WINDOW * 2)
    not_reset = source.snapshot()
    reset = source.snapshot()

    assert reasons(not_reset) == {
        0: "XID 94: contained ECC error; 1 uncorrectable ECC error(s) since the last GPU reset"
    }
    assert reasons(reset) == {}


def test_an_xid_from_an_unnamed_gpu_holds_only_the_gpus_nvml_cannot_read() -> None:
    recording = machine(gpus=3)
    recording.library["nvmlEventSetWait"] = [xid(79, gpu=None), fails(TIMEOUT)]
    recording.gpus[1]["nvmlDeviceGetUUID"] = [fails(pynvml.NVML_ERROR_GPU_IS_LOST)]
    source, _ = source_for(recording, Clock())

    snapshot = source.snapshot()

    (event,) = snapshot.xid_events
    assert event.gpu_index is None
    assert reasons(snapshot) == {
        1: "XID 79: GPU has fallen off the bus; "
        "GPU is lost: NVML nvmlDeviceGetUUID answered 'GPU is lost'"
    }


def test_an_xid_from_an_unnamed_gpu_holds_no_gpu_that_answers() -> None:
    recording = machine(gpus=3)
    recording.library["nvmlEventSetWait"] = [xid(74, gpu=None), fails(TIMEOUT)]
    source, _ = source_for(recording, Clock())

    snapshot = source.snapshot()

    (event,) = snapshot.xid_events
    assert event.gpu_index is None
    assert reasons(snapshot) == {}


def test_an_xid_from_a_gpu_that_cannot_say_its_index_holds_that_gpu_by_its_handle() -> None:
    clock = Clock()
    recording = machine(gpus=3)
    recording.library["nvmlEventSetWait"] = [fails(TIMEOUT), xid(79, gpu=2), fails(TIMEOUT)]
    lost = fails(pynvml.NVML_ERROR_GPU_IS_LOST)
    for function in ("nvmlDeviceGetIndex", "nvmlDeviceGetUUID"):
        recording.gpus[2][function] = [lost]
    recording.gpus[2]["nvmlDeviceGetHandleByIndex"] = [ok({"handle": 2}), lost]
    source, _ = source_for(recording, clock)

    source.snapshot()
    fallen = source.snapshot()

    (event,) = fallen.xid_events
    assert event.gpu_index == 2
    assert reasons(fallen) == {
        2: "XID 79: GPU has fallen off the bus; "
        "GPU is lost: NVML nvmlDeviceGetHandleByIndex answered 'GPU is lost'"
    }


def test_an_xid_from_a_gpu_that_cannot_say_its_index_is_placed_by_its_uuid() -> None:
    recording = machine(gpus=3)
    recording.library["nvmlEventSetWait"] = [fails(TIMEOUT), xid(95, gpu=1), fails(TIMEOUT)]
    recording.gpus[1]["nvmlDeviceGetIndex"] = [fails(pynvml.NVML_ERROR_GPU_IS_LOST)]
    source, _ = source_for(recording, Clock())

    source.snapshot()
    snapshot = source.snapshot()

    assert snapshot.xid_events[0].gpu_index == 1
    assert reasons(snapshot) == {1: "XID 95: uncontained ECC error"}


def test_an_xid_missing_from_the_table_is_unknown_and_unhealthy() -> None:
    recording = machine()
    recording.library["nvmlEventSetWait"] = [xid(4242, gpu=1), fails(TIMEOUT)]
    source, _ = source_for(recording, Clock())

    snapshot = source.snapshot()

    (event,) = snapshot.xid_events
    assert (event.gpu_index, event.classification) == (1, XidClass.UNKNOWN)
    assert reasons(snapshot) == {1: "XID 4242: unknown XID, not in the catalogue"}


def test_an_unknown_error_from_nvml_means_the_gpu_is_lost() -> None:
    recording = machine()
    recording.gpus[1]["nvmlDeviceGetMemoryInfo"] = [fails(pynvml.NVML_ERROR_UNKNOWN)]
    source, nvml = source_for(recording, Clock())

    snapshot = source.snapshot()

    assert reasons(snapshot) == {
        1: "GPU is lost: NVML nvmlDeviceGetMemoryInfo answered 'Unknown Error'"
    }
    assert snapshot.gpus[1].uuid == "", "never read before it was lost: nothing to show"
    asked_after = [call.function for call in nvml.calls if call.gpu == 1]
    assert "nvmlDeviceGetRemappedRows" not in asked_after, "a lost GPU is not asked further"


def test_any_other_nvml_error_in_a_check_makes_the_gpu_unhealthy_while_it_lasts() -> None:
    recording = machine()
    no_permission = fails(pynvml.NVML_ERROR_NO_PERMISSION)
    recording.gpus[0]["nvmlDeviceGetTotalEccErrors"] = [no_permission, ok(0)]
    source, _ = source_for(recording, Clock())

    failing = source.snapshot()
    answered = source.snapshot()

    assert reasons(failing) == {
        0: "NVML nvmlDeviceGetTotalEccErrors failed: Insufficient Permissions"
    }
    assert reasons(answered) == {}


def test_row_remapping_failure_is_reported_in_words() -> None:
    recording = machine()
    recording.gpus[1]["nvmlDeviceGetRemappedRows"] = [ok([3, 8, 0, 1])]
    source, _ = source_for(recording, Clock())

    assert reasons(source.snapshot()) == {
        1: "row remapping failed: a faulty memory row could not be remapped"
    }


def test_a_driver_loaded_after_start_is_picked_up() -> None:
    recording = machine()
    recording.library["nvmlInit"] = [fails(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), ok()]
    source, _ = source_for(recording, Clock())

    without = source.snapshot()
    loaded = source.snapshot()

    assert without.gpus == ()
    assert without.unavailable_reason == "no NVML: no GPUs discovered (Driver Not Loaded)"
    assert len(loaded.gpus) == 2
    assert loaded.unavailable_reason is None


def test_nvml_that_fails_to_start_for_another_reason_says_so() -> None:
    recording = machine()
    recording.library["nvmlInit"] = [fails(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)]
    source, _ = source_for(recording, Clock())

    snapshot = source.snapshot()

    assert snapshot.gpus == ()
    assert snapshot.unavailable_reason is not None
    assert snapshot.unavailable_reason.startswith("NVML failed to start: no GPUs discovered (")
    assert "version mismatch" in snapshot.unavailable_reason


def test_a_machine_with_the_driver_and_no_gpus_says_so() -> None:
    recording = machine(gpus=0)
    source, _ = source_for(recording, Clock())

    assert source.snapshot() == GpuSnapshot(gpus=(), unavailable_reason="NVML found no GPUs")


def test_counting_gpus_failing_is_reported_as_unavailable() -> None:
    recording = machine()
    recording.library["nvmlDeviceGetCount"] = [fails(pynvml.NVML_ERROR_UNKNOWN)]
    source, _ = source_for(recording, Clock())

    snapshot = source.snapshot()

    assert snapshot.gpus == ()
    assert snapshot.unavailable_reason == "NVML could not count the GPUs: Unknown Error"


def test_xid_registration_is_retried_for_a_gpu_that_was_lost_but_not_if_unsupported() -> None:
    recording = machine()
    recording.gpus[0]["nvmlDeviceRegisterEvents"] = [fails(pynvml.NVML_ERROR_GPU_IS_LOST), ok()]
    recording.gpus[1]["nvmlDeviceRegisterEvents"] = [fails(pynvml.NVML_ERROR_NOT_SUPPORTED)]
    source, nvml = source_for(recording, Clock())

    for _ in range(3):
        source.snapshot()

    registrations = [call.gpu for call in nvml.calls if call.function == "nvmlDeviceRegisterEvents"]
    assert registrations == [0, 1, 0]


def test_without_an_event_set_health_is_still_checked() -> None:
    recording = machine()
    recording.library["nvmlEventSetCreate"] = [fails(pynvml.NVML_ERROR_NOT_SUPPORTED)]
    recording.gpus[0]["nvmlDeviceGetTotalEccErrors"] = [ok(2)]
    source, nvml = source_for(recording, Clock())

    snapshot = source.snapshot()

    assert reasons(snapshot) == {0: "2 uncorrectable ECC error(s) since the last GPU reset"}
    asked = {call.function for call in nvml.calls}
    assert asked.isdisjoint({"nvmlEventSetWait", "nvmlDeviceRegisterEvents"})


def test_a_negative_recovery_window_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        XidHolds(timedelta(seconds=-1))
