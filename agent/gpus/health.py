"""Health rules shared by every GPU source: what one reading found, and how long an XID
holds a GPU unhealthy.

A GPU is unhealthy while any check finds a problem (the source lists them in the
reading) or while an XID whose verdict is "unhealthy" holds it. That hold lasts until the
recovery window has passed since the last such XID *and* a snapshot finds the other
checks clean; a GPU reset clears the counters the checks read, so a GPU that was reset
is reported healthy again without restarting the agent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from agent.gpus.types import GpuStatus, XidEvent
from agent.gpus.xid import xid_reason

DEFAULT_XID_RECOVERY = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What one snapshot learned about one GPU; ``problems`` in words, empty when clean."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    problems: tuple[str, ...] = ()


class XidHolds:
    """Which GPUs an unhealthy XID still holds, and since when."""

    def __init__(self, recovery: timedelta = DEFAULT_XID_RECOVERY) -> None:
        if recovery < timedelta(0):
            raise ValueError(f"the XID recovery window cannot be negative, got {recovery}")
        self._recovery = recovery
        self._holds: dict[int, XidEvent] = {}

    def note(self, event: XidEvent, gpu_indices: Iterable[int]) -> None:
        """Hold the event's GPU, or every GPU in ``gpu_indices`` when the driver did not
        say which one it was: an unplaceable hardware fault must not be ignored."""
        if not event.marks_unhealthy:
            return
        targets = gpu_indices if event.gpu_index is None else (event.gpu_index,)
        for index in targets:
            self._holds[index] = event

    def holding(self, index: int, now: datetime, *, other_problems: bool) -> XidEvent | None:
        """The XID holding GPU ``index`` at ``now``, releasing it once it has recovered."""
        hold = self._holds.get(index)
        if hold is None:
            return None
        if not other_problems and now - hold.at >= self._recovery:
            del self._holds[index]
            return None
        return hold


def judge(reading: GpuReading, hold: XidEvent | None) -> GpuStatus:
    reasons = [*reading.problems]
    if hold is not None:
        reasons.insert(0, xid_reason(hold.xid))
    return GpuStatus(
        index=reading.index,
        uuid=reading.uuid,
        name=reading.name,
        memory_total_mib=reading.memory_total_mib,
        memory_used_mib=reading.memory_used_mib,
        healthy=not reasons,
        unhealthy_reason="; ".join(reasons) or None,
        xid=None if hold is None else hold.xid,
    )
