"""``RecordedNvml``: a stand-in for ``pynvml`` that replays a recording.

It has the functions and constants of ``pynvml`` that the GPU source uses, and raises
pynvml's own error classes (``NVMLError_GpuIsLost`` ...), so code under test cannot tell
it from the real module. See ``recording`` for the format and how answers are handed out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pynvml

from agent.gpus.recording import Answer, JsonValue, RaisedError, Recording, load_recording

NVML_ERROR_INVALID_ARGUMENT = 2


class RecordingMismatch(Exception):
    """The code asked for an answer the recording does not hold."""


@dataclass(frozen=True, slots=True)
class RecordedHandle:
    index: int


@dataclass(frozen=True, slots=True)
class RecordedEventSet:
    pass


@dataclass(frozen=True, slots=True)
class RecordedMemory:
    total: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    device: RecordedHandle | None
    eventType: int
    eventData: int


@dataclass(frozen=True, slots=True)
class Call:
    function: str
    gpu: int | None


class RecordedNvml:
    NVMLError = pynvml.NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, recording: Recording) -> None:
        self._queues: dict[tuple[int | None, str], deque[Answer]] = {}
        for function, answers in recording.library.items():
            self._queues[(None, function)] = deque(answers)
        for gpu, functions in recording.gpus.items():
            for function, answers in functions.items():
                self._queues[(gpu, function)] = deque(answers)
        self.calls: list[Call] = []

    @classmethod
    def from_file(cls, path: Path) -> RecordedNvml:
        return cls(load_recording(path))

    # -- the pynvml subset ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._answer(None, "nvmlInit")

    def nvmlShutdown(self) -> None:
        self._answer(None, "nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return _int(self._answer(None, "nvmlDeviceGetCount"))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> RecordedHandle:
        return _handle(self._answer(index, "nvmlDeviceGetHandleByIndex"))

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return _int(self._answer(_gpu(handle), "nvmlDeviceGetIndex"))

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return _str(self._answer(_gpu(handle), "nvmlDeviceGetUUID"))

    def nvmlDeviceGetName(self, handle: object) -> str:
        return _str(self._answer(_gpu(handle), "nvmlDeviceGetName"))

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> RecordedMemory:
        memory = _fields(self._answer(_gpu(handle), "nvmlDeviceGetMemoryInfo"))
        return RecordedMemory(_int(memory["total"]), _int(memory["free"]), _int(memory["used"]))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int:
        return _int(self._answer(_gpu(handle), "nvmlDeviceGetRetiredPagesPendingStatus"))

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]:
        rows = self._answer(_gpu(handle), "nvmlDeviceGetRemappedRows")
        if not isinstance(rows, list) or len(rows) != 4:
            raise RecordingMismatch(
                f"remapped rows are [corrected, uncorrected, pending, failure], got {rows!r}"
            )
        corrected, uncorrected, pending, failure = (_int(value) for value in rows)
        return corrected, uncorrected, pending, failure

    def nvmlDeviceGetTotalEccErrors(
        self, handle: object, error_type: int, counter_type: int
    ) -> int:
        return _int(self._answer(_gpu(handle), "nvmlDeviceGetTotalEccErrors"))

    def nvmlEventSetCreate(self) -> RecordedEventSet:
        self._answer(None, "nvmlEventSetCreate")
        return RecordedEventSet()

    def nvmlDeviceRegisterEvents(self, handle: object, event_types: int, event_set: object) -> None:
        self._answer(_gpu(handle), "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> RecordedEvent:
        event = _fields(self._answer(None, "nvmlEventSetWait"))
        device = event.get("device")
        return RecordedEvent(
            device=None if device is None else _handle(device),
            eventType=_int(event["eventType"]),
            eventData=_int(event["eventData"]),
        )

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._answer(None, "nvmlEventSetFree")

    # -- replay --------------------------------------------------------------------------

    def _answer(self, gpu: int | None, function: str) -> JsonValue:
        self.calls.append(Call(function, gpu))
        answers = self._queues.get((gpu, function))
        where = "the library" if gpu is None else f"GPU {gpu}"
        if not answers:
            raise RecordingMismatch(f"the recording has no answer for {function} on {where}")
        answer = answers[0] if len(answers) == 1 else answers.popleft()
        if answer.raises is not None:
            raise _nvml_error(answer.raises)
        return answer.returns


def _nvml_error(raised: RaisedError) -> Exception:
    if raised.value is None:
        return RuntimeError(f"{raised.error}: {raised.message}")
    error: Exception = pynvml.NVMLError(raised.value)
    if type(error) is not pynvml.NVMLError and type(error).__name__ != raised.error:
        raise RecordingMismatch(
            f"NVML error {raised.value} is {type(error).__name__}, "
            f"the recording says {raised.error}"
        )
    return error


def _gpu(handle: object) -> int:
    if not isinstance(handle, RecordedHandle):
        raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.index


def _handle(value: JsonValue) -> RecordedHandle:
    return RecordedHandle(_int(_fields(value).get("handle")))


def _fields(value: JsonValue) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise RecordingMismatch(f"expected an object, got {value!r}")
    return value


def _int(value: JsonValue) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordingMismatch(f"expected an integer, got {value!r}")
    return value


def _str(value: JsonValue) -> str:
    if not isinstance(value, str):
        raise RecordingMismatch(f"expected a string, got {value!r}")
    return value
