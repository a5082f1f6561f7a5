"""NVML losing its driver after it started: the source shuts NVML down, reports the GPUs
it knew as unhealthy, and starts NVML again on a later snapshot with a growing wait."""

from __future__ import annotations

from datetime import timedelta

import pynvml

from agent.gpus.recording import Recording
from tests.unit.test_gpus_health import Clock, fails, machine, ok, reasons, source_for


def driver_lost_reason(why: str) -> str:
    return f"NVML lost the driver ({why}): the GPU cannot be read until NVML starts again"


UNINITIALIZED = driver_lost_reason("Uninitialized")


def reloaded_machine() -> Recording:
    """Two healthy GPUs; the second count finds NVML uninitialised, the third is fine."""
    recording = machine(gpus=2)
    recording.library.update(
        nvmlDeviceGetCount=[ok(2), fails(pynvml.NVML_ERROR_UNINITIALIZED), ok(2)],
        nvmlEventSetFree=[ok()],
        nvmlShutdown=[ok()],
    )
    return recording


def test_a_driver_reload_marks_the_gpus_unhealthy_until_nvml_starts_again() -> None:
    clock = Clock()
    source, nvml = source_for(reloaded_machine(), clock)

    before = source.snapshot()
    reloaded = source.snapshot()
    clock.advance(timedelta(seconds=1))
    waiting = source.snapshot()
    clock.advance(timedelta(seconds=5))
    back = source.snapshot()

    assert reasons(before) == {}
    assert reasons(reloaded) == {0: UNINITIALIZED, 1: UNINITIALIZED}
    assert [gpu.uuid for gpu in reloaded.gpus] == [gpu.uuid for gpu in before.gpus]
    assert reasons(waiting) == {0: UNINITIALIZED, 1: UNINITIALIZED}
    assert reasons(back) == {}
    assert back.gpus == before.gpus
    library_calls = [call.function for call in nvml.calls if call.gpu is None]
    assert library_calls.count("nvmlShutdown") == 1
    assert library_calls.count("nvmlInit") == 2, "not again while waiting"
    assert library_calls.count("nvmlEventSetCreate") == 2
    registered = [call.gpu for call in nvml.calls if call.function == "nvmlDeviceRegisterEvents"]
    assert registered == [0, 1, 0, 1], "the new event set watches every GPU again"


def test_a_failing_restart_waits_twice_as_long_before_the_next() -> None:
    clock = Clock()
    recording = reloaded_machine()
    not_loaded = fails(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    recording.library["nvmlInit"] = [ok(), not_loaded, ok()]
    source, nvml = source_for(recording, clock)

    source.snapshot()
    source.snapshot()
    clock.advance(timedelta(seconds=5))
    still_gone = source.snapshot()
    clock.advance(timedelta(seconds=9))
    waiting = source.snapshot()
    clock.advance(timedelta(seconds=1))
    back = source.snapshot()

    gone = "starting it again failed: Driver Not Loaded"
    assert reasons(still_gone) == dict.fromkeys((0, 1), driver_lost_reason(gone))
    assert reasons(waiting) == dict.fromkeys((0, 1), driver_lost_reason(gone))
    assert reasons(back) == {}
    assert [call.function for call in nvml.calls].count("nvmlInit") == 3


def test_every_gpu_lost_at_once_starts_nvml_afresh() -> None:
    clock = Clock()
    recording = reloaded_machine()
    recording.library["nvmlDeviceGetCount"] = [ok(2)]
    for index in (0, 1):
        recording.gpus[index]["nvmlDeviceGetUUID"] = [
            ok(f"GPU-0000000{index}-7f3a-2c41-9e0b-5d8a1c2e4f6b"),
            fails(pynvml.NVML_ERROR_GPU_IS_LOST),
            ok(f"GPU-0000000{index}-7f3a-2c41-9e0b-5d8a1c2e4f6b"),
        ]
    source, nvml = source_for(recording, clock)

    source.snapshot()
    lost = source.snapshot()
    clock.advance(timedelta(seconds=4))
    waiting = source.snapshot()
    clock.advance(timedelta(seconds=1))
    back = source.snapshot()

    lost_reason = "GPU is lost: NVML nvmlDeviceGetUUID answered 'GPU is lost'"
    assert reasons(lost) == {0: lost_reason, 1: lost_reason}
    assert reasons(waiting) == reasons(lost), "the reasons do not flap while NVML is down"
    assert reasons(back) == {}
    assert [call.function for call in nvml.calls].count("nvmlInit") == 2, "not at 4 s"
    library_calls = [call.function for call in nvml.calls if call.gpu is None]
    assert library_calls.count("nvmlShutdown") == 1
    assert library_calls.count("nvmlInit") == 2


def test_gpus_that_stay_lost_wait_longer_for_each_restart() -> None:
    clock = Clock()
    recording = reloaded_machine()
    recording.library["nvmlDeviceGetCount"] = [ok(2)]
    for index in (0, 1):
        recording.gpus[index]["nvmlDeviceGetUUID"] = [fails(pynvml.NVML_ERROR_GPU_IS_LOST)]
    source, nvml = source_for(recording, clock)

    for seconds in (0, 5, 9, 1, 19, 1):
        clock.advance(timedelta(seconds=seconds))
        source.snapshot()

    assert [call.function for call in nvml.calls].count("nvmlInit") == 4, "at 0, 5, 15 and 35 s"


def test_one_lost_gpu_among_answering_ones_keeps_nvml_running() -> None:
    recording = reloaded_machine()
    recording.library["nvmlDeviceGetCount"] = [ok(2)]
    recording.gpus[1]["nvmlDeviceGetUUID"] = [fails(pynvml.NVML_ERROR_GPU_IS_LOST)]
    source, nvml = source_for(recording, Clock())

    for _ in range(3):
        source.snapshot()

    assert [call.function for call in nvml.calls].count("nvmlInit") == 1


def test_a_driver_lost_while_reading_a_gpu_shuts_nvml_down_too() -> None:
    recording = reloaded_machine()
    recording.library["nvmlDeviceGetCount"] = [ok(2)]
    recording.gpus[1]["nvmlDeviceGetMemoryInfo"] = [
        ok({"total": 85899345920, "free": 0, "used": 0}),
        fails(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
    ]
    source, _ = source_for(recording, Clock())

    source.snapshot()
    lost = source.snapshot()

    assert reasons(lost) == dict.fromkeys((0, 1), driver_lost_reason("Driver Not Loaded"))


def test_nvml_lost_before_any_gpu_was_listed_says_so_without_gpus() -> None:
    recording = reloaded_machine()
    recording.library["nvmlDeviceGetCount"] = [fails(pynvml.NVML_ERROR_UNINITIALIZED)]
    source, _ = source_for(recording, Clock())

    snapshot = source.snapshot()

    assert snapshot.gpus == ()
    assert snapshot.unavailable_reason == UNINITIALIZED


def test_a_gpu_lost_after_a_reload_that_renumbered_the_gpus_does_not_take_anothers_uuid() -> None:
    """After the reload NVML lists GPU-b as GPU 0, and GPU 1 cannot be read. The last GPU
    read as GPU 1 was GPU-b: reported under that UUID, GPU 1 would list GPU-b twice, and a
    hello that does is refused. GPU 1 is reported without a UUID, as a GPU never read."""
    clock = Clock()
    recording = reloaded_machine()
    recording.gpus[0]["nvmlDeviceGetUUID"] = [ok("GPU-a"), ok("GPU-b")]
    recording.gpus[1]["nvmlDeviceGetUUID"] = [ok("GPU-b"), fails(pynvml.NVML_ERROR_GPU_IS_LOST)]
    source, _ = source_for(recording, clock)

    before = source.snapshot()
    source.snapshot()
    clock.advance(timedelta(seconds=5))
    renumbered = source.snapshot()

    assert [gpu.uuid for gpu in before.gpus] == ["GPU-a", "GPU-b"]
    assert [(gpu.index, gpu.uuid, gpu.healthy) for gpu in renumbered.gpus] == [
        (0, "GPU-b", True),
        (1, "", False),
    ]
    assert reasons(renumbered) == {1: "GPU is lost: NVML nvmlDeviceGetUUID answered 'GPU is lost'"}


LOST = "GPU is lost: NVML nvmlDeviceGetUUID answered 'GPU is lost'"


def test_gpus_lost_after_the_count_shrank_and_grew_back_list_each_uuid_once() -> None:
    """Three GPUs; a reload lists only one, GPU-b, as GPU 0; then three again, and GPUs 0
    and 1 cannot be read. GPU-b was last read as GPU 0, and before the shrink as GPU 1:
    listed as last read under each index, both would say GPU-b, and a hello that lists
    a UUID twice is refused. GPU-b stays with the index it was last read under; GPU 1 is
    listed as a GPU never read."""
    recording = machine(gpus=3)
    recording.library["nvmlDeviceGetCount"] = [ok(3), ok(1), ok(3)]
    lost = fails(pynvml.NVML_ERROR_GPU_IS_LOST)
    recording.gpus[0]["nvmlDeviceGetUUID"] = [ok("GPU-a"), ok("GPU-b"), lost]
    recording.gpus[1]["nvmlDeviceGetUUID"] = [ok("GPU-b"), lost]
    recording.gpus[2]["nvmlDeviceGetUUID"] = [ok("GPU-c")]
    source, _ = source_for(recording, Clock())

    before = source.snapshot()
    shrunk = source.snapshot()
    grown = source.snapshot()

    assert [gpu.uuid for gpu in before.gpus] == ["GPU-a", "GPU-b", "GPU-c"]
    assert [gpu.uuid for gpu in shrunk.gpus] == ["GPU-b"]
    assert [(gpu.index, gpu.uuid, gpu.healthy) for gpu in grown.gpus] == [
        (0, "GPU-b", False),
        (1, "", False),
        (2, "GPU-c", True),
    ]
    assert reasons(grown) == {0: LOST, 1: LOST}


def test_gpus_all_lost_after_the_count_shrank_and_grew_back_list_each_uuid_once() -> None:
    """As above with two GPUs, both lost once the count grows back: NVML is shut down, and
    the GPUs it listed, as they wait for it to start again, list GPU-b once too."""
    clock = Clock()
    recording = reloaded_machine()
    recording.library["nvmlDeviceGetCount"] = [ok(2), ok(1), ok(2)]
    lost = fails(pynvml.NVML_ERROR_GPU_IS_LOST)
    recording.gpus[0]["nvmlDeviceGetUUID"] = [ok("GPU-a"), ok("GPU-b"), lost]
    recording.gpus[1]["nvmlDeviceGetUUID"] = [ok("GPU-b"), lost]
    source, _ = source_for(recording, clock)

    source.snapshot()
    source.snapshot()
    grown = source.snapshot()
    clock.advance(timedelta(seconds=1))
    waiting = source.snapshot()

    for snapshot in (grown, waiting):
        assert [(gpu.index, gpu.uuid) for gpu in snapshot.gpus] == [(0, "GPU-b"), (1, "")]
        assert reasons(snapshot) == {0: LOST, 1: LOST}
