"""What the agent knows about its GPUs, independent of where it learned it.

The agent turns these into wire messages elsewhere; nothing here depends on ``app/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agent.gpus.xid import XidClass, classify_xid


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuStatus:
    """One GPU as of one snapshot. ``xid`` names the XID holding it unhealthy, if one does."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    healthy: bool = True
    unhealthy_reason: str | None = None
    xid: int | None = None
    listed: bool = True
    """False for a GPU the source no longer lists, kept as last seen (``agent.gpu_reports``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class XidEvent:
    """An XID the driver reported. ``gpu_index`` is None when the driver did not say which
    GPU it came from. ``at`` is when the agent collected it: NVML events carry no time."""

    gpu_index: int | None
    xid: int
    classification: XidClass
    description: str
    marks_unhealthy: bool
    at: datetime


def xid_event(code: int, gpu_index: int | None, at: datetime) -> XidEvent:
    """XID ``code`` on GPU ``gpu_index``, collected ``at``, as the XID table classifies it:
    how every GPU source, NVML's or the fake one, tells of an XID."""
    info = classify_xid(code)
    return XidEvent(
        gpu_index=gpu_index,
        xid=info.code,
        classification=info.classification,
        description=info.description,
        marks_unhealthy=info.marks_unhealthy,
        at=at,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSnapshot:
    """Every GPU of the machine, plus the XID events seen since the previous snapshot.

    ``unavailable_reason`` says why no GPUs could be listed at all (no driver, NVML failed).
    """

    gpus: tuple[GpuStatus, ...]
    xid_events: tuple[XidEvent, ...] = ()
    unavailable_reason: str | None = None


class GpuSource(Protocol):
    def snapshot(self) -> GpuSnapshot:
        """Blocking: callers on an event loop run it in a thread. Not reentrant."""
        ...

    def close(self) -> None: ...
