"""The part of ``pynvml`` the GPU source uses, as a protocol.

The real module, the replaying fake (``recorded.RecordedNvml``) and the recording proxy
(``record.RecordingNvml``) all satisfy it. Device handles and event sets are opaque.

NVML reports failures as ``NVMLError`` subclasses carrying the C error code in
``value``; pynvml names the subclass after the code (``NVMLError_GpuIsLost`` for 15).
The codes below are the C library's and do not change between versions.
"""

from __future__ import annotations

from typing import Protocol

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NO_DRIVER_CODES = frozenset({NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED})
"""nvmlInit failed because this machine has no NVIDIA driver (or it is not loaded)."""

DRIVER_LOST_CODES = frozenset(
    {
        NVML_ERROR_UNINITIALIZED,
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_LIBRARY_NOT_FOUND,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
"""What NVML answers, from any call, once it has lost the driver it was started on (the
driver was unloaded, reloaded or upgraded): nothing works until NVML is shut down and
initialised again."""

LOST_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN})
"""What NVML answers for a GPU that has fallen off the bus."""

UNSUPPORTED_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
"""The GPU or the driver cannot answer this query (ECC on consumer GPUs, old drivers)."""


class NvmlMemory(Protocol):
    @property
    def total(self) -> int: ...

    @property
    def free(self) -> int: ...

    @property
    def used(self) -> int: ...


class NvmlEventData(Protocol):
    @property
    def device(self) -> object: ...

    @property
    def eventType(self) -> int: ...

    @property
    def eventData(self) -> int: ...


class NvmlLibrary(Protocol):
    NVMLError: type[Exception]
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int
    nvmlEventTypeXidCriticalError: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetIndex(self, handle: object) -> int: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> NvmlMemory: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetTotalEccErrors(
        self, handle: object, error_type: int, counter_type: int
    ) -> int: ...
    def nvmlEventSetCreate(self) -> object: ...
    def nvmlDeviceRegisterEvents(
        self, handle: object, event_types: int, event_set: object
    ) -> None: ...
    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> NvmlEventData: ...
    def nvmlEventSetFree(self, event_set: object) -> None: ...


def error_code(exc: BaseException) -> int:
    """The NVML error code an exception carries; UNKNOWN if it carries none."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else NVML_ERROR_UNKNOWN


def error_message(exc: BaseException) -> str:
    """NVML's words for the error (``GPU is lost``), without failing on odd codes."""
    try:
        text = str(exc)
    except Exception:  # pynvml asks the library for unknown codes' strings; it may fail too
        text = ""
    return text or f"NVML error {error_code(exc)}"
