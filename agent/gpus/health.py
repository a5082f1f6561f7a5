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

    def note(self, event: XidEvent, unreadable: Iterable[int]) -> None:
        """Hold the event's GPU; when no GPU could be named, hold the ``unreadable`` ones.

        The source names the GPU by its index, its UUID or its handle, so an event nothing
        names comes from a GPU NVML can no longer reach. Holding every GPU for it, as
        NVIDIA's device plugin does, would take a whole node out of service for one lost
        GPU, and keep it out for the recovery window after that GPU is replaced. The GPUs
        that still answer every query are not the one that failed; the ones that do not
        answer are its only candidates, and they are unhealthy already: the hold adds the
        XID to their reason and keeps them out for the window once they answer again."""
        if not event.marks_unhealthy:
            return
        targets = unreadable if event.gpu_index is None else (event.gpu_index,)
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
