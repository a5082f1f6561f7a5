"""Record what NVML answers on a real GPU machine, for replay in tests.

    python -m agent.gpus.record nvml.json [--snapshots N] [--interval SECONDS]

The GPU source runs as usual over ``RecordingNvml``, which passes every call to pynvml
and writes down what came back or what was raised. The file is written even when a call
fails in a way the source does not expect; ``meta.error`` then says what happened.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ParamSpec, TypeVar

from agent.gpus.handles import same_device
from agent.gpus.nvml import NvmlGpuSource
from agent.gpus.nvml_api import NvmlEventData, NvmlLibrary, NvmlMemory
from agent.gpus.recording import Answer, JsonValue, RaisedError, Recording, write_recording
from agent.gpus.types import GpuSnapshot

P = ParamSpec("P")
T = TypeVar("T")


class RecordingNvml:
    """An ``NvmlLibrary`` that passes every call to ``inner`` and records its answer."""

    def __init__(self, inner: NvmlLibrary) -> None:
        self._inner = inner
        self.NVMLError = inner.NVMLError
        self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = inner.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        self.NVML_VOLATILE_ECC = inner.NVML_VOLATILE_ECC
        self.nvmlEventTypeXidCriticalError = inner.nvmlEventTypeXidCriticalError
        self.recording = Recording()
        self._handles: list[tuple[object, int]] = []

    def nvmlInit(self) -> None:
        self._pass(None, "nvmlInit", _nothing, self._inner.nvmlInit)

    def nvmlShutdown(self) -> None:
        self._pass(None, "nvmlShutdown", _nothing, self._inner.nvmlShutdown)

    def nvmlDeviceGetCount(self) -> int:
        return self._pass(None, "nvmlDeviceGetCount", int, self._inner.nvmlDeviceGetCount)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        handle = self._pass(
            index,
            "nvmlDeviceGetHandleByIndex",
            lambda _: {"handle": index},
            self._inner.nvmlDeviceGetHandleByIndex,
            index,
        )
        self._handles.append((handle, index))
        return handle

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        inner = self._inner.nvmlDeviceGetIndex
        return self._pass(self._gpu_of(handle), "nvmlDeviceGetIndex", int, inner, handle)

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        inner = self._inner.nvmlDeviceGetUUID
        return self._pass(self._gpu_of(handle), "nvmlDeviceGetUUID", _text, inner, handle)

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        inner = self._inner.nvmlDeviceGetName
        return self._pass(self._gpu_of(handle), "nvmlDeviceGetName", _text, inner, handle)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> NvmlMemory:
        inner = self._inner.nvmlDeviceGetMemoryInfo
        return self._pass(self._gpu_of(handle), "nvmlDeviceGetMemoryInfo", _memory, inner, handle)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int:
        function = "nvmlDeviceGetRetiredPagesPendingStatus"
        inner = self._inner.nvmlDeviceGetRetiredPagesPendingStatus
        return self._pass(self._gpu_of(handle), function, int, inner, handle)

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]:
        inner = self._inner.nvmlDeviceGetRemappedRows
        return self._pass(self._gpu_of(handle), "nvmlDeviceGetRemappedRows", _ints, inner, handle)

    def nvmlDeviceGetTotalEccErrors(
        self, handle: object, error_type: int, counter_type: int
    ) -> int:
        inner = self._inner.nvmlDeviceGetTotalEccErrors
        gpu = self._gpu_of(handle)
        return self._pass(
            gpu, "nvmlDeviceGetTotalEccErrors", int, inner, handle, error_type, counter_type
        )

    def nvmlEventSetCreate(self) -> object:
        return self._pass(None, "nvmlEventSetCreate", _nothing, self._inner.nvmlEventSetCreate)

    def nvmlDeviceRegisterEvents(self, handle: object, event_types: int, event_set: object) -> None:
        inner = self._inner.nvmlDeviceRegisterEvents
        gpu = self._gpu_of(handle)
        self._pass(gpu, "nvmlDeviceRegisterEvents", _nothing, inner, handle, event_types, event_set)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> NvmlEventData:
        inner = self._inner.nvmlEventSetWait
        return self._pass(None, "nvmlEventSetWait", self._event, inner, event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: object) -> None:
        inner = self._inner.nvmlEventSetFree
        self._pass(None, "nvmlEventSetFree", _nothing, inner, event_set)

    # -- recording -----------------------------------------------------------------------

    def _pass(
        self,
        gpu: int | None,
        function: str,
        encode: Callable[[T], JsonValue],
        call: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        answers = self.recording.answers(gpu).setdefault(function, [])
        try:
            result = call(*args, **kwargs)
        except Exception as exc:
            code = getattr(exc, "value", None) if isinstance(exc, self.NVMLError) else None
            raised = RaisedError(
                type(exc).__name__, code if isinstance(code, int) else None, _message(exc)
            )
            answers.append(Answer(raises=raised))
            raise
        try:
            answers.append(Answer(returns=encode(result)))
        except Exception:  # an answer of an unexpected shape is kept for a person to read
            answers.append(Answer(returns=f"unrecordable answer: {result!r}"))
        return result

    def _gpu_of(self, handle: object) -> int | None:
        for known, index in self._handles:
            if same_device(known, handle):
                return index
        return None

    def _event(self, data: NvmlEventData) -> JsonValue:
        gpu = self._gpu_of(data.device) if data.device else None
        return {
            "device": None if gpu is None else {"handle": gpu},
            "eventType": int(data.eventType),
            "eventData": int(data.eventData),
        }


def _nothing(_: object) -> JsonValue:
    return None


def _text(value: str | bytes) -> JsonValue:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _memory(memory: NvmlMemory) -> JsonValue:
    return {"total": int(memory.total), "free": int(memory.free), "used": int(memory.used)}


def _ints(values: tuple[int, ...]) -> JsonValue:
    return [int(value) for value in values]


def _message(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:
        return ""


# -- the recorder ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    recording: Recording
    snapshots: tuple[GpuSnapshot, ...]
    error: str | None


def record_nvml(
    path: Path,
    *,
    snapshots: int = 1,
    interval_s: float = 1.0,
    description: str = "",
    nvml: NvmlLibrary | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RecordOutcome:
    """Take ``snapshots`` snapshots through ``nvml`` (pynvml by default), ``interval_s``
    apart, and write every answer to ``path``. Always writes the file."""
    if snapshots < 1:
        raise ValueError(f"record at least one snapshot, not {snapshots}")
    if nvml is None:
        import pynvml

        nvml = pynvml
    proxy = RecordingNvml(nvml)
    source = NvmlGpuSource(proxy)
    taken: list[GpuSnapshot] = []
    error: str | None = None
    meta = {"recorded_at": datetime.now(UTC).isoformat(timespec="seconds")}
    if description:
        meta["description"] = description
    try:
        for number in range(snapshots):
            if number:
                sleep(interval_s)
            taken.append(source.snapshot())
            if number == 0:
                meta.update(_driver_version(nvml))
    except Exception as exc:  # keep what was recorded up to the failure
        error = f"{type(exc).__name__}: {_message(exc)}"
        meta["error"] = error
    finally:
        with contextlib.suppress(Exception):
            source.close()
    proxy.recording.meta.update(meta)
    write_recording(path, proxy.recording)
    return RecordOutcome(proxy.recording, tuple(taken), error)


def _driver_version(nvml: NvmlLibrary) -> dict[str, str]:
    """Not part of what the source asks, so not replayed: a note for the reader."""
    ask = getattr(nvml, "nvmlSystemGetDriverVersion", None)
    if ask is None:
        return {}
    try:
        version = ask()
    except Exception:
        return {}
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    return {"driver_version": str(version)}


def _summary(outcome: RecordOutcome, path: Path) -> str:
    lines = [f"wrote {path}: {len(outcome.snapshots)} snapshot(s)"]
    if outcome.snapshots:
        last = outcome.snapshots[-1]
        if last.unavailable_reason:
            lines.append(f"  {last.unavailable_reason}")
        for gpu in last.gpus:
            health = "healthy" if gpu.healthy else f"unhealthy: {gpu.unhealthy_reason}"
            lines.append(f"  GPU {gpu.index} {gpu.name} {gpu.uuid} {health}")
        for event in last.xid_events:
            lines.append(f"  XID {event.xid} on GPU {event.gpu_index}: {event.description}")
    if outcome.error:
        lines.append(f"  stopped early: {outcome.error}")
    return "\n".join(lines)


def _snapshot_count(text: str) -> int:
    """A whole number of at least 1, else bad usage (exit 2) before anything is recorded."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count}: record at least one snapshot")
    return count


def _interval_seconds(text: str) -> float:
    """0 or more seconds, else bad usage (exit 2): refused before the first snapshot, not
    after it as the sleep before the second."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{text}: expected 0 or more seconds")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent.gpus.record",
        description="Record what NVML answers on this machine, for replay in tests.",
    )
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument(
        "--snapshots", type=_snapshot_count, default=1, help="how many snapshots to take"
    )
    parser.add_argument(
        "--interval", type=_interval_seconds, default=1.0, help="seconds between snapshots"
    )
    parser.add_argument("--description", default="", help="a note stored in the recording")
    args = parser.parse_args(argv)
    outcome = record_nvml(
        args.out,
        snapshots=args.snapshots,
        interval_s=args.interval,
        description=args.description,
    )
    print(_summary(outcome, args.out))
    return 1 if outcome.error else 0


if __name__ == "__main__":
    sys.exit(main())
