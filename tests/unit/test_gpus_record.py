"""The recorder: what it writes replays to what it saw."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest

from agent.gpus.nvml import NvmlGpuSource
from agent.gpus.record import RecordingNvml, main, record_nvml
from agent.gpus.recorded import RecordedHandle, RecordedNvml
from agent.gpus.recording import RecordingError, load_recording
from agent.gpus.types import GpuSnapshot

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
FIXTURE_NAMES = sorted(path.name for path in FIXTURES.glob("*.json"))
SNAPSHOTS = 3


def fixed_now() -> datetime:
    return datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def replayed(nvml: RecordedNvml) -> list[GpuSnapshot]:
    source = NvmlGpuSource(nvml, now=fixed_now)
    return [source.snapshot() for _ in range(SNAPSHOTS)]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_a_recording_replays_to_the_snapshots_it_recorded(name: str, tmp_path: Path) -> None:
    out = tmp_path / "nvml.json"

    outcome = record_nvml(
        out,
        snapshots=SNAPSHOTS,
        interval_s=0,
        nvml=RecordedNvml.from_file(FIXTURES / name),
    )

    assert outcome.error is None
    assert len(outcome.snapshots) == SNAPSHOTS
    assert replayed(RecordedNvml.from_file(out)) == replayed(
        RecordedNvml.from_file(FIXTURES / name)
    )


def test_errors_are_recorded_by_nvml_class_name_and_value(tmp_path: Path) -> None:
    out = tmp_path / "nvml.json"

    record_nvml(out, interval_s=0, nvml=RecordedNvml.from_file(FIXTURES / "rtx4090_no_ecc.json"))

    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["gpus"]["0"]["nvmlDeviceGetTotalEccErrors"] == [
        {"raises": {"error": "NVMLError_NotSupported", "value": 3, "message": "Not Supported"}}
    ]
    assert written["meta"]["recorded_at"]


def test_snapshots_are_taken_the_given_interval_apart(tmp_path: Path) -> None:
    slept: list[float] = []

    record_nvml(
        tmp_path / "nvml.json",
        snapshots=3,
        interval_s=2.5,
        nvml=RecordedNvml.from_file(FIXTURES / "h100x8_healthy.json"),
        sleep=slept.append,
    )

    assert slept == [2.5, 2.5]


class NameQueryBreaks(RecordedNvml):
    """A library whose name query fails with an error that is not NVML's."""

    def nvmlDeviceGetName(self, handle: object) -> str:
        raise TypeError("bad argument type for built-in operation")


def test_an_unexpected_failure_still_writes_what_was_recorded(tmp_path: Path) -> None:
    out = tmp_path / "nvml.json"
    library = NameQueryBreaks(load_recording(FIXTURES / "h100x8_healthy.json"))

    outcome = record_nvml(out, snapshots=2, interval_s=0, nvml=library)

    assert outcome.error == "TypeError: bad argument type for built-in operation"
    recording = load_recording(out)
    assert recording.meta["error"] == outcome.error
    assert recording.library["nvmlInit"][0].returns is None
    (failure,) = recording.gpus[0]["nvmlDeviceGetName"]
    assert failure.raises is not None
    assert (failure.raises.error, failure.raises.value) == ("TypeError", None)
    assert [answer.returns for answer in recording.library["nvmlShutdown"]] == [None]


def test_pynvml_handles_of_one_device_are_recognised_as_that_gpu() -> None:
    devices = [pynvml.struct_c_nvmlDevice_t(), pynvml.struct_c_nvmlDevice_t()]
    recorder = RecordingNvml(RecordedNvml.from_file(FIXTURES / "h100x8_healthy.json"))
    recorder._handles = [(ctypes.pointer(device), index) for index, device in enumerate(devices)]

    # pynvml builds a new pointer object for every handle it returns, events included
    event_device = ctypes.cast(ctypes.pointer(devices[1]), pynvml.c_nvmlDevice_t)

    assert recorder._gpu_of(event_device) == 1
    assert recorder._gpu_of(ctypes.pointer(pynvml.struct_c_nvmlDevice_t())) is None
    assert recorder._gpu_of(RecordedHandle(0)) is None


def test_the_module_entry_point_records_this_machine(tmp_path: Path) -> None:
    out = tmp_path / "nvml.json"

    finished = subprocess.run(
        [sys.executable, "-m", "agent.gpus.record", str(out), "--description", "this machine"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert finished.returncode == 0, finished.stderr
    assert f"wrote {out}: 1 snapshot(s)" in finished.stdout
    recording = load_recording(out)
    assert recording.meta["description"] == "this machine"
    snapshot = NvmlGpuSource(RecordedNvml(recording)).snapshot()
    if snapshot.unavailable_reason is not None:
        assert snapshot.unavailable_reason in finished.stdout
    for gpu in snapshot.gpus:
        assert gpu.uuid in finished.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--snapshots", "0"], "argument --snapshots: 0: record at least one snapshot"),
        (["--snapshots", "two"], "argument --snapshots: 'two' is not a whole number"),
        (["--interval", "-1", "--snapshots", "2"], "argument --interval: -1: expected 0 or more"),
        (["--interval", "nan", "--snapshots", "2"], "argument --interval: nan: expected 0 or more"),
    ],
)
def test_main_refuses_bad_arguments_as_usage_before_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    """Exit 2 with the reason, not a traceback, nor one snapshot then a failed sleep."""
    out = tmp_path / "nvml.json"

    with pytest.raises(SystemExit) as exited:
        main([str(out), *arguments])

    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_recording_that_is_not_utf8_or_not_a_regular_file_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    garbled = tmp_path / "garbled.json"
    garbled.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(RecordingError, match=r"garbled\.json: not UTF-8 text \(byte 0xff"):
        load_recording(garbled)

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(RecordingError, match=r"fifo\.json: not a regular file but a named pipe"):
        load_recording(fifo)
