"""Which GPU a report is about: a GPU is known by its UUID, by its index only without one.

NVML numbers GPUs in the order it finds them, so after one falls off the bus and the
driver is reloaded the same GPU can be listed under another index, and another GPU under
its old one. Two GPUs are the same GPU when their UUIDs are equal; when either has no UUID
(a GPU the agent could never read lists none), the index is all there is to go by, as the
agent does (``agent.runtime``).
"""

from __future__ import annotations

from typing import Protocol


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
