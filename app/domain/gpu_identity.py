"""Which GPU a report is about: a GPU is known by its UUID, by its index only without one.

NVML numbers GPUs in the order it finds them, so after one falls off the bus and the
driver is reloaded the same GPU can be listed under another index, and another GPU under
its old one. Two GPUs are the same GPU when their UUIDs are equal; when either has no UUID
(a GPU the agent could never read lists none), the index is all there is to go by, as the
agent does (``agent.gpu_reports``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar


class NumberedGpu(Protocol):
    """A GPU as a node lists it: under an index, with the UUID it read, if any."""

    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str: ...


def same_gpu(gpu: NumberedGpu, *, index: int, uuid: str) -> bool:
    """Whether ``gpu`` is the GPU listed under ``index`` with ``uuid``."""
    if gpu.uuid and uuid:
        return gpu.uuid == uuid
    return gpu.index == index


Known = TypeVar("Known", bound=NumberedGpu)


def known_as(
    gpu: NumberedGpu, known: Sequence[Known], listed_uuids: Collection[str]
) -> Known | None:
    """The GPU of ``known`` (the first, so the most trusted first) that ``gpu`` is, as
    listed together with GPUs of ``listed_uuids``: the one with its UUID, under whatever
    index; else, when either has no UUID, one under its index, unless that one's UUID is
    listed too, under another index, where it is."""
    if gpu.uuid:
        for candidate in known:
            if candidate.uuid == gpu.uuid:
                return candidate
    for candidate in known:
        if candidate.uuid not in listed_uuids and same_gpu(
            candidate, index=gpu.index, uuid=gpu.uuid
        ):
            return candidate
    return None
