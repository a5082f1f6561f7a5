"""GPU discovery and health through NVML.

Each snapshot lists the GPUs, drains the XID events NVML queued since the previous one
and runs the health checks (``nvml_checks``; see ``health`` and docs/gpus.md for the
rules), each NVML error read as ``nvml_calls`` says:

- retired pages pending, row remapping pending or failed, volatile uncorrectable ECC
  errors: unhealthy while NVML reports them;
- ``GpuIsLost`` or ``Unknown`` from any query: the GPU has fallen off the bus, unhealthy;
- ``NotSupported`` (ECC and row remapping on consumer GPUs): the check is skipped, the
  GPU stays healthy;
- any other NVML error from a query: unhealthy while it lasts, the error in the reason.

A machine without the driver gives an empty snapshot that says so; the source retries
``nvmlInit`` on the next snapshot, so a driver loaded later is picked up.

NVML that loses its driver once started (reloaded, unloaded or upgraded: calls answer
``Uninitialized`` or ``Driver Not Loaded``, or every GPU answers lost at once) is shut
down, and started again on a later snapshot with a growing wait (``restarts``); meanwhile
the GPUs it listed are reported unhealthy, saying so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from agent.gpus.handles import same_device
from agent.gpus.health import DEFAULT_XID_RECOVERY, GpuReading, XidHolds, judge
from agent.gpus.nvml_api import NO_DRIVER_CODES, NvmlLibrary, error_code, error_message
from agent.gpus.nvml_calls import CallFailed, DriverLost, GpuLost, Unreadable, ask, ask_gpu
from agent.gpus.nvml_checks import health_problems
from agent.gpus.restarts import RestartBackoff
from agent.gpus.types import GpuSnapshot, GpuStatus, XidEvent, xid_event

MIB = 1024 * 1024
# A driver that keeps queueing events must not keep one snapshot draining forever.
MAX_EVENTS_PER_SNAPSHOT = 1024


def driver_lost_reason(why: str) -> str:
    """How a GPU explains itself while NVML is down after losing the driver."""
    return f"NVML lost the driver ({why}): the GPU cannot be read until NVML starts again"


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class _StartFailed(Exception):
    """``nvmlInit`` failed; ``reason`` says so for a snapshot without GPUs."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.message = message
        if code in NO_DRIVER_CODES:
            self.reason = f"no NVML: no GPUs discovered ({message})"
        else:
            self.reason = f"NVML failed to start: no GPUs discovered ({message})"


class NvmlGpuSource:
    """A ``GpuSource`` over ``pynvml`` or anything shaped like it (``RecordedNvml``)."""

    def __init__(
        self,
        nvml: NvmlLibrary,
        *,
        xid_recovery: timedelta = DEFAULT_XID_RECOVERY,
        now: Callable[[], datetime] = _utc_now,
        restarts: RestartBackoff | None = None,
    ) -> None:
        self._nvml = nvml
        self._now = now
        self._holds = XidHolds(xid_recovery)
        self._started = False
        self._closed = False
        self._event_set: object | None = None
        self._xid_registration_settled: set[int] = set()
        self._last_readings: dict[int, GpuReading] = {}
        self._known_handles: dict[int, object] = {}
        self._listed: tuple[int, ...] = ()
        self._restarts = restarts or RestartBackoff()
        self._driver_lost: str | None = None  # why NVML was shut down, while it is down
        self._down_readings: tuple[GpuReading, ...] = ()  # what the GPUs show meanwhile

    def snapshot(self) -> GpuSnapshot:
        if self._closed:
            raise RuntimeError("the NVML GPU source is closed")
        now = self._now()
        if self._driver_lost is not None and not self._restarts.due(now):
            return self._while_driver_lost(now)
        if not self._started:
            try:
                self._start()
            except _StartFailed as failed:
                if self._driver_lost is None:  # never started: no GPUs were ever listed
                    return GpuSnapshot(gpus=(), unavailable_reason=failed.reason)
                why = f"starting it again failed: {failed.message}"
                self._driver_lost = why
                self._down_readings = self._unreadable_as(why)
                self._restarts.failed(now)
                return self._while_driver_lost(now)
        try:
            snapshot = self._read_machine(now)
        except DriverLost as lost:
            self._shut_down(lost.why, now, self._unreadable_as(lost.why))
            return self._while_driver_lost(now)
        if self._started:  # not shut down for every GPU being lost
            self._driver_lost = None
            self._restarts.succeeded()
        return snapshot

    def _read_machine(self, now: datetime) -> GpuSnapshot:
        try:
            count = ask(self._nvml, self._nvml.nvmlDeviceGetCount)
        except CallFailed as failed:
            return GpuSnapshot(
                gpus=(), unavailable_reason=f"NVML could not count the GPUs: {failed.message}"
            )
        handles = self._open_handles(count)
        self._register_for_xids(handles)
        events = self._drain_xid_events(now)
        readings = self._without_taken_uuids(
            [self._read(index, handle) for index, handle in handles]
        )
        unreadable = [reading.index for reading, failure in readings if failure is not None]
        for event in events:
            self._holds.note(event, unreadable)
        gpus = tuple(self._status(reading, now) for reading, _ in readings)
        self._listed = tuple(gpu.index for gpu in gpus)
        if readings and all(isinstance(failure, GpuLost) for _, failure in readings):
            # Every GPU lost at once is what a reloaded driver looks like to handles taken
            # before it: start NVML afresh on a later snapshot. Until then the GPUs keep
            # the reasons read now, so a GPU that stays lost does not flap between two.
            lost_readings = tuple(reading for reading, _ in readings)
            self._shut_down("every GPU answered that it is lost", now, lost_readings)
        return GpuSnapshot(
            gpus=gpus,
            xid_events=tuple(events),
            unavailable_reason=None if gpus else "NVML found no GPUs",
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._release()

    # -- starting ------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise _StartFailed(error_code(exc), error_message(exc)) from exc
        self._started = True
        try:
            self._event_set = self._nvml.nvmlEventSetCreate()
        except self._nvml.NVMLError:
            self._event_set = None  # XIDs go unwatched; every other check still runs

    def _release(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            if self._event_set is not None:
                self._nvml.nvmlEventSetFree(self._event_set)
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def _shut_down(self, why: str, now: datetime, readings: tuple[GpuReading, ...]) -> None:
        """Let go of an NVML that lost its driver; the handles and the event set it gave
        are dead, so a later start takes new ones and registers them for XIDs again."""
        self._release()
        self._started = False
        self._event_set = None
        self._xid_registration_settled.clear()
        self._known_handles.clear()
        self._driver_lost = why
        self._down_readings = readings
        self._restarts.failed(now)

    def _unreadable_as(self, why: str) -> tuple[GpuReading, ...]:
        """The GPUs last listed, as last read, each unhealthy because NVML is down."""
        reason = driver_lost_reason(why)
        return tuple(self._last_reading(index, reason) for index in self._listed)

    def _while_driver_lost(self, now: datetime) -> GpuSnapshot:
        assert self._driver_lost is not None
        gpus = tuple(self._status(reading, now) for reading in self._down_readings)
        reason = None if gpus else driver_lost_reason(self._driver_lost)
        return GpuSnapshot(gpus=gpus, unavailable_reason=reason)

    def _open_handles(self, count: int) -> list[tuple[int, object]]:
        """Each GPU's handle, or the ``Unreadable`` saying why it could not be opened."""
        handles: list[tuple[int, object]] = []
        for index in range(count):
            try:
                handle = ask_gpu(self._nvml, self._nvml.nvmlDeviceGetHandleByIndex, index)
            except Unreadable as exc:
                handles.append((index, exc))
                continue
            handles.append((index, handle))
            self._known_handles[index] = handle
        return handles

    # -- XID events ----------------------------------------------------------------------

    def _register_for_xids(self, handles: list[tuple[int, object]]) -> None:
        if self._event_set is None:
            return
        for index, handle in handles:
            if index in self._xid_registration_settled or isinstance(handle, Unreadable):
                continue
            try:
                ask(
                    self._nvml,
                    self._nvml.nvmlDeviceRegisterEvents,
                    handle,
                    self._nvml.nvmlEventTypeXidCriticalError,
                    self._event_set,
                )
            except CallFailed as failed:
                if failed.unsupported:
                    self._xid_registration_settled.add(index)
                continue  # a GPU lost now may come back: register it on a later snapshot
            self._xid_registration_settled.add(index)

    def _drain_xid_events(self, now: datetime) -> list[XidEvent]:
        if self._event_set is None:
            return []
        events: list[XidEvent] = []
        for _ in range(MAX_EVENTS_PER_SNAPSHOT):
            try:
                data = ask(self._nvml, self._nvml.nvmlEventSetWait, self._event_set, 0)
            except CallFailed:
                break  # Timeout: nothing left; any other error: the next snapshot tries again
            if data.eventType != self._nvml.nvmlEventTypeXidCriticalError:
                continue
            code = int(data.eventData)
            events.append(xid_event(code, self._event_gpu_index(data.device), now))
        return events

    def _event_gpu_index(self, device: object) -> int | None:
        """The index of the GPU an event came from: NVML's answer, or else the GPU whose
        UUID or handle it carries (a GPU off the bus may not say its index any more)."""
        if not device:  # a NULL handle: the driver did not say which GPU
            return None
        with contextlib.suppress(CallFailed):
            return ask(self._nvml, self._nvml.nvmlDeviceGetIndex, device)
        with contextlib.suppress(CallFailed):
            uuid = _text(ask(self._nvml, self._nvml.nvmlDeviceGetUUID, device))
            for index, reading in self._last_readings.items():
                if reading.uuid and reading.uuid == uuid:
                    return index
        for index, handle in self._known_handles.items():
            if same_device(handle, device):
                return index
        return None

    # -- one GPU -------------------------------------------------------------------------

    def _read(self, index: int, handle: object) -> tuple[GpuReading, Unreadable | None]:
        """What the GPU answered, and why it could not be read if it could not."""
        if isinstance(handle, Unreadable):
            return self._last_reading(index, handle.reason), handle
        try:
            uuid = _text(ask_gpu(self._nvml, self._nvml.nvmlDeviceGetUUID, handle))
            name = _text(ask_gpu(self._nvml, self._nvml.nvmlDeviceGetName, handle))
            memory = ask_gpu(self._nvml, self._nvml.nvmlDeviceGetMemoryInfo, handle)
            problems = health_problems(self._nvml, handle)
        except Unreadable as exc:
            return self._last_reading(index, exc.reason), exc
        reading = GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            memory_total_mib=memory.total // MIB,
            memory_used_mib=memory.used // MIB,
            problems=tuple(problems),
        )
        self._remember(reading)
        return reading, None

    def _remember(self, reading: GpuReading) -> None:
        """Keep ``reading`` as what was last read under its index, and forget the UUID
        under any other: a GPU is where it was last read. After a driver reload NVML may
        list fewer GPUs and number them anew, so a GPU last read under one index can answer
        under another; once the count grows back, GPUs that cannot be read would otherwise
        be listed as last read under both, one UUID twice, and a hello that lists it twice
        is refused. The GPU that was read longer ago is listed as one never read."""
        for index, last in list(self._last_readings.items()):
            if index != reading.index and reading.uuid and last.uuid == reading.uuid:
                del self._last_readings[index]
        self._last_readings[reading.index] = reading

    def _without_taken_uuids(
        self, readings: list[tuple[GpuReading, Unreadable | None]]
    ) -> list[tuple[GpuReading, Unreadable | None]]:
        """``readings``, with each GPU that could not be read, but whose last reading's
        UUID another GPU answered now, known by nothing more than its index: after a driver
        reload NVML may number the GPUs anew, and that UUID is the other GPU's now. A hello
        that listed it twice would be refused."""
        answered = {reading.uuid for reading, failure in readings if failure is None}
        kept: list[tuple[GpuReading, Unreadable | None]] = []
        for reading, failure in readings:
            if failure is not None and reading.uuid and reading.uuid in answered:
                self._last_readings.pop(reading.index, None)
                reading = GpuReading(reading.index, "", "unknown", 0, 0, reading.problems)
            kept.append((reading, failure))
        return kept

    def _last_reading(self, index: int, problem: str) -> GpuReading:
        """What was last known of a GPU that cannot be read now, with why not."""
        last = self._last_readings.get(index)
        if last is None:
            return GpuReading(index, "", "unknown", 0, 0, (problem,))
        return GpuReading(
            index, last.uuid, last.name, last.memory_total_mib, last.memory_used_mib, (problem,)
        )

    def _status(self, reading: GpuReading, now: datetime) -> GpuStatus:
        hold = self._holds.holding(reading.index, now, other_problems=bool(reading.problems))
        return judge(reading, hold)


class UnavailableNvml:
    """A ``GpuSource`` for a machine where pynvml itself cannot be imported."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(gpus=(), unavailable_reason=self._reason)

    def close(self) -> None:
        pass
