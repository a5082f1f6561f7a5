"""The agent's GPU snapshot as it reports it to the control plane.

Each snapshot the GPU source takes is kept with the GPUs it no longer lists (unhealthy,
``listed`` False, until they come back), and compared with the one before it: the GPUs
whose health changed go out with the next heartbeat, and the hello lists every GPU as a
``GpuReport``. A GPU's used memory goes out with a heartbeat once it differs by at least
``GPU_MEMORY_CHANGE_MIB`` from what the agent last said of it (``MemoryReadings``). Texts
are cut to what the wire carries (``agent.reports``); the corrections of a listing that
names an index or a UUID twice are ``agent.gpu_duplicates``', and which GPUs a hello
listed is ``agent.gpu_inventory``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agent.gpus import GpuSnapshot, GpuStatus
from agent.reports import MAX_GPU_NAME_BYTES, MAX_GPU_REASON_BYTES, fit_text, wire_uuid
from wire.messages import (
    GPU_MEMORY_CHANGE_MIB,
    MAX_XID,
    GpuHealthChange,
    GpuMemoryReading,
    GpuReport,
)


def gpu_report(gpu: GpuStatus) -> GpuReport:
    return GpuReport(
        index=gpu.index,
        uuid=wire_uuid(gpu.uuid),
        name=fit_text(gpu.name, MAX_GPU_NAME_BYTES),
        memory_total_mib=gpu.memory_total_mib,
        memory_used_mib=gpu.memory_used_mib,
        healthy=gpu.healthy,
        unhealthy_reason=_wire_text(gpu.unhealthy_reason),
    )


def _wire_text(text: str | None) -> str | None:
    """``text`` cut to what the wire carries: a reason joined from many problems (or a fake
    GPU's, set by hand) costs its tail, not every heartbeat of the connection."""
    return None if text is None else fit_text(text, MAX_GPU_REASON_BYTES)


def gpu_health_changes(
    previous: Sequence[GpuStatus], current: Sequence[GpuStatus]
) -> list[GpuHealthChange]:
    """The GPUs whose health or reason changed; a GPU not seen before counts as having
    been healthy."""
    before = {gpu.index: (gpu.healthy, gpu.unhealthy_reason) for gpu in previous}
    return [
        GpuHealthChange(
            index=gpu.index,
            uuid=wire_uuid(gpu.uuid),
            healthy=gpu.healthy,
            reason=_wire_text(gpu.unhealthy_reason),
            xid=gpu.xid if gpu.xid is not None and 0 <= gpu.xid <= MAX_XID else None,
        )
        for gpu in current
        if before.get(gpu.index, (True, None)) != (gpu.healthy, gpu.unhealthy_reason)
    ]


class MemoryReadings:
    """What the agent last said of each GPU's used memory, and what it has to say next.

    The hello says every GPU's (``said``); a heartbeat then carries the GPUs whose used
    memory moved by at least ``GPU_MEMORY_CHANGE_MIB`` from what was said of them
    (``changed``), so the control plane places on what a GPU has free now, not at the
    hello, and a GPU whose memory holds still costs no heartbeat a byte. A reading goes out
    at most once a heartbeat; one taken between two heartbeats replaces the one before."""

    def __init__(self) -> None:
        self._said: dict[int, tuple[str, int]] = {}

    def said(self, gpus: Sequence[GpuStatus]) -> None:
        """A hello listed ``gpus``: only they are read from now on, from what it said."""
        self._said = {gpu.index: (gpu.uuid, gpu.memory_used_mib) for gpu in gpus}

    def changed(self, gpus: Sequence[GpuStatus]) -> tuple[GpuMemoryReading, ...]:
        """The readings of ``gpus`` that moved enough since said, now taken as said."""
        readings: list[GpuMemoryReading] = []
        for gpu in gpus:
            known = self._said.get(gpu.index)
            if known is None or known[0] != gpu.uuid or not gpu.listed:
                continue
            used = min(max(gpu.memory_used_mib, 0), gpu.memory_total_mib)
            if abs(used - known[1]) < GPU_MEMORY_CHANGE_MIB:
                continue
            self._said[gpu.index] = (gpu.uuid, used)
            readings.append(
                GpuMemoryReading(index=gpu.index, uuid=wire_uuid(gpu.uuid), used_mib=used)
            )
        return tuple(readings)


VANISHED_GPU_REASON = (
    "no longer listed by the GPU source (lost from the bus, or the driver reloaded)"
)


def with_vanished_gpus(previous: GpuSnapshot, current: GpuSnapshot) -> GpuSnapshot:
    """``current``, with each GPU of ``previous`` it no longer lists kept as unhealthy.

    A GPU that falls off the bus, or every GPU after a driver reload, can drop out of the
    listing rather than be listed unhealthy. Left out, it would change nothing the
    control plane hears (``gpu_health_changes`` compares the GPUs listed), and the control
    plane would go on placing replicas on a GPU this agent refuses as unknown. Kept as
    unhealthy, its loss goes out with the next heartbeat, and its return as a change back
    to healthy (or, under another index, as a new hello).

    A GPU is known by its UUID (``_unlisted_gpus``). One whose index a listed GPU now has
    is left out (``displaced_gpus``): a hello that lists an index twice is refused."""
    taken = {gpu.index for gpu in current.gpus}
    vanished = tuple(
        replace(
            gpu,
            healthy=False,
            unhealthy_reason=VANISHED_GPU_REASON
            + (f": {current.unavailable_reason}" if current.unavailable_reason else ""),
            xid=None,
            listed=False,
        )
        if gpu.healthy or gpu.unhealthy_reason is None
        else replace(gpu, listed=False)  # its own reason says more
        for gpu in _unlisted_gpus(previous, current)
        if gpu.index not in taken
    )
    if not vanished:
        return current
    gpus = tuple(sorted((*current.gpus, *vanished), key=lambda gpu: gpu.index))
    return replace(current, gpus=gpus)


def displaced_gpus(
    previous: GpuSnapshot, current: GpuSnapshot
) -> list[tuple[GpuStatus, GpuStatus]]:
    """Each GPU of ``previous`` that ``current`` no longer lists, with the GPU ``current``
    lists under its index (the driver reloaded and numbered the GPUs anew). The listed GPU
    is the one at that index now: the vanished one is left out of the snapshot, and so of
    the hellos, since a hello that lists an index twice is refused."""
    at = {gpu.index: gpu for gpu in current.gpus}
    return [(gpu, at[gpu.index]) for gpu in _unlisted_gpus(previous, current) if gpu.index in at]


def _unlisted_gpus(previous: GpuSnapshot, current: GpuSnapshot) -> list[GpuStatus]:
    """The GPUs of ``previous`` that ``current`` does not list. A GPU is known by its UUID:
    after a driver reload NVML may list the same GPU under another index. One without a
    UUID (never read) is known by its index."""
    uuids = {gpu.uuid for gpu in current.gpus if gpu.uuid}
    indexes = {gpu.index for gpu in current.gpus}
    return [
        gpu
        for gpu in previous.gpus
        if (gpu.uuid not in uuids if gpu.uuid else gpu.index not in indexes)
    ]
