"""Fake GPUs for development and tests: declared on the command line, marked unhealthy
through a JSON file while the agent runs.

``parse_fake_gpus("4x80GB")`` gives four GPUs of 80 GiB each. The health file
(``agent.gpus.fake_health``) maps GPU indices to reasons, ``{"2": "XID 79: GPU has fallen
off the bus"}``; it is read on every snapshot, so removing a key recovers that GPU. A
reason that starts with ``XID <code>`` is also reported once as an XID event, as NVML
would, and an XID whose verdict is "healthy" (an application's fault, XID 13) leaves its
GPU healthy, as the NVML source does. Whatever else the file holds is ignored with one
warning: the node keeps its GPUs.

A fake GPU has no memory in use until the memory file beside the health file
(``agent.gpus.fake_memory``) says other processes use some, ``{"0": 30000}``; it is read
on every snapshot too, and an entry for more than its GPU has is ignored with a warning.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import structlog

from agent.gpus.fake_health import MAX_FAKE_GPUS, read_health_file, unknown_gpu_problems
from agent.gpus.fake_memory import memory_file_beside, read_memory_file
from agent.gpus.types import GpuSnapshot, GpuStatus, XidEvent, xid_event
from agent.gpus.xid import classify_xid

log = structlog.get_logger(__name__)

_SPEC = re.compile(r"(?P<count>\d+)\s*x\s*(?P<size>\d+)\s*(?P<unit>GB|GiB|MiB)", re.IGNORECASE)
_UNITS = {"gb": ("GB", 1024), "gib": ("GiB", 1024), "mib": ("MiB", 1)}
_XID_REASON = re.compile(r"XID (?P<code>\d+)\b")
_UUID_NAMESPACE = uuid.UUID("9d1c6f4e-43d2-4f0e-9a51-5b1f3c0e7a21")


def parse_fake_gpus(spec: str, seed: str = "") -> list[GpuStatus]:
    """``COUNTxSIZE`` with SIZE in GB, GiB or MiB (GB is read as GiB, as GPU memory is
    quoted). UUIDs are derived from ``seed`` (a node id), so a node keeps its GPUs' UUIDs
    across restarts and two nodes never share one."""
    match = _SPEC.fullmatch(spec.strip())
    if match is None:
        raise ValueError(
            f"fake GPU spec {spec!r}: expected COUNTxSIZE such as '4x80GB' or '2x24576MiB' "
            "(units GB, GiB or MiB)"
        )
    count, size = int(match["count"]), int(match["size"])
    if count < 1:
        raise ValueError(f"fake GPU spec {spec!r}: count must be 1 to {MAX_FAKE_GPUS}")
    if count > MAX_FAKE_GPUS:
        raise ValueError(
            f"fake GPU spec {spec!r}: {count} GPUs; a node may report at most {MAX_FAKE_GPUS} "
            "(the control plane refuses a hello with more)"
        )
    if size < 1:
        raise ValueError(f"fake GPU spec {spec!r}: memory size must be positive")
    unit, mib_per_unit = _UNITS[match["unit"].lower()]
    return [
        GpuStatus(
            index=index,
            uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{seed}/{index}')}",
            name=f"llmgw fake GPU {size}{unit}",
            memory_total_mib=size * mib_per_unit,
            memory_used_mib=0,
        )
        for index in range(count)
    ]


class FakeGpuSource:
    """A ``GpuSource`` over declared GPUs, with health read from ``health_file``."""

    def __init__(
        self,
        gpus: Sequence[GpuStatus],
        health_file: Path | None = None,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._gpus = tuple(gpus)
        self._health_file = health_file
        self._now = now
        self._reported: dict[int, str] = {}
        self._warned: tuple[str, ...] = ()
        self._warned_memory: tuple[str, ...] = ()

    def snapshot(self) -> GpuSnapshot:
        overrides = self._overrides()
        events: list[XidEvent] = []
        for index, reason in sorted(overrides.items()):
            code = _xid_of(reason)
            if code is not None and self._reported.get(index) != reason:
                events.append(xid_event(code, index, self._now()))
        self._reported = overrides
        # An XID the table calls the application's fault is reported, as NVML would, and
        # leaves its GPU healthy: the source's rule for it, not the file's mark, decides.
        faults = {index: reason for index, reason in overrides.items() if _marks_unhealthy(reason)}
        used = self._used_mib()
        gpus = tuple(
            replace(
                gpu,
                healthy=gpu.index not in faults,
                unhealthy_reason=faults.get(gpu.index),
                xid=_xid_of(faults.get(gpu.index)),
                memory_used_mib=used.get(gpu.index, 0),
            )
            for gpu in self._gpus
        )
        return GpuSnapshot(gpus=gpus, xid_events=tuple(events))

    def close(self) -> None:
        """Nothing to release: fake GPUs hold no driver handle (NVML's source shuts NVML
        down here)."""

    def _overrides(self) -> dict[int, str]:
        if self._health_file is None:
            return {}
        health = read_health_file(self._health_file)
        known = [gpu.index for gpu in self._gpus]
        overrides = {i: reason for i, reason in health.overrides.items() if i in known}
        problems = (
            *health.problems,
            *unknown_gpu_problems(self._health_file, health.overrides, known),
        )
        # The file is read every few seconds: say what is wrong with it once, not each time.
        if problems and problems != self._warned:
            log.warning("fake_gpu_health_file_ignored", problems=list(problems))
        self._warned = problems
        return overrides

    def _used_mib(self) -> dict[int, int]:
        """MiB used per GPU, as the memory file says, for the GPUs it may be true of."""
        if self._health_file is None:
            return {}
        path = memory_file_beside(self._health_file)
        memory = read_memory_file(path)
        totals = {gpu.index: gpu.memory_total_mib for gpu in self._gpus}
        used: dict[int, int] = {}
        problems = list(memory.problems)
        for index, mib in sorted(memory.used_mib.items()):
            total = totals.get(index)
            if total is None:
                problems.append(f"{path}: entry {index} ignored: this node has no GPU {index}")
            elif mib > total:
                problems.append(
                    f"{path}: entry {index} ignored: {mib} MiB used, GPU {index} has {total} MiB"
                )
            else:
                used[index] = mib
        if problems and tuple(problems) != self._warned_memory:
            log.warning("fake_gpu_memory_file_ignored", problems=problems)
        self._warned_memory = tuple(problems)
        return used


def _marks_unhealthy(reason: str) -> bool:
    """A reason that names no XID marks its GPU; one that names an XID does as its verdict says."""
    code = _xid_of(reason)
    return code is None or classify_xid(code).marks_unhealthy


def _xid_of(reason: str | None) -> int | None:
    match = _XID_REASON.match(reason or "")
    return int(match["code"]) if match else None
