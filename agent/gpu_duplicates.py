"""A GPU listing the control plane accepts: no index and no UUID in it twice.

The control plane refuses a hello that lists one GPU index twice, or one UUID twice (an
empty UUID, a GPU never read, aside), comparing the UUIDs as the hello carries them, cut
to ``MAX_GPU_UUID_BYTES`` (``app.hub.claims``). The GPU source and the vanished GPUs the
runtime keeps are built never to list one twice (docs/gpus.md); a listing that did
anyway would keep the node from connecting until the agent restarted. So each snapshot
the agent keeps, and so each hello and heartbeat, is corrected here first:

- a second GPU under one index is left out. The one kept is a GPU the source lists now
  over one kept as vanished, else the first listed;
- a second GPU with one UUID is listed without it, unhealthy, saying why. The one that
  keeps the UUID is a GPU the source lists now over one kept as vanished, a healthy one
  (it answered) over an unhealthy one (it may be listed as last read), else the lower
  index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from agent.gpus import GpuStatus
from agent.reports import wire_uuid

DUPLICATE_UUID_REASON = (
    "listed with the UUID of another GPU: which of the two has it cannot be told"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplicateGpu:
    """A GPU that shared its ``index`` or ``uuid`` with the GPU ``kept``, and what became
    of it: ``left out`` of the listing, or listed ``without its UUID``."""

    gpu: GpuStatus
    kept: GpuStatus
    shared: Literal["index", "uuid"]
    outcome: Literal["left out", "without its UUID"]

    @property
    def which(self) -> tuple[str, int, str, int, str]:
        """The correction, apart from readings that change from one snapshot to the next."""
        return (self.shared, self.gpu.index, self.gpu.uuid, self.kept.index, self.kept.uuid)


def without_duplicate_gpus(
    gpus: Sequence[GpuStatus],
) -> tuple[tuple[GpuStatus, ...], tuple[DuplicateGpu, ...]]:
    """``gpus`` with no index and no UUID listed twice, in their order, and what was
    corrected to get there (nothing for a listing the control plane accepts as it is)."""
    duplicates: list[DuplicateGpu] = []
    kept: dict[int, int] = {}  # a GPU index -> the position of the GPU listed under it
    for position in sorted(range(len(gpus)), key=lambda p: not gpus[p].listed):  # stable
        first = kept.setdefault(gpus[position].index, position)
        if first != position:
            duplicates.append(
                DuplicateGpu(
                    gpu=gpus[position], kept=gpus[first], shared="index", outcome="left out"
                )
            )
    listed = {position: gpus[position] for position in sorted(kept.values())}
    holders: dict[str, int] = {}  # a UUID as the hello carries it -> the position of its GPU
    for position in sorted(listed, key=lambda p: _claim_to_its_uuid(gpus[p])):
        gpu = gpus[position]
        uuid = wire_uuid(gpu.uuid)
        holder = holders.setdefault(uuid, position) if uuid else position
        if holder != position:
            duplicates.append(
                DuplicateGpu(gpu=gpu, kept=gpus[holder], shared="uuid", outcome="without its UUID")
            )
            listed[position] = replace(
                gpu,
                uuid="",
                healthy=False,
                unhealthy_reason=DUPLICATE_UUID_REASON if gpu.healthy else gpu.unhealthy_reason,
                xid=None if gpu.healthy else gpu.xid,
            )
    return tuple(listed.values()), tuple(duplicates)


def _claim_to_its_uuid(gpu: GpuStatus) -> tuple[bool, bool, int]:
    return (not gpu.listed, not gpu.healthy, gpu.index)
