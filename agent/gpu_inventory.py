"""Which GPUs a node has, as its hello lists them, and when that list no longer holds.

The control plane takes a node's GPUs from its hello only; heartbeats carry health changes
of the GPUs the hello listed. So once the GPU source lists a GPU the hello did not, the
agent must say hello again (``AgentRuntime`` closes the connection and the reconnect loop
dials again).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.gpus import GpuStatus
from agent.reports import wire_uuid

GpuInventory = frozenset[tuple[int, str]]
"""Which GPUs a node has: each one's index and UUID, as its hello lists them."""


def gpu_inventory(gpus: Sequence[GpuStatus]) -> GpuInventory:
    return frozenset((gpu.index, wire_uuid(gpu.uuid)) for gpu in gpus)


def inventory_change(said: GpuInventory, now: GpuInventory) -> str | None:
    """Why a hello that listed ``said`` no longer tells the control plane which GPUs this
    node has, or None while it does. Heartbeats carry only health changes of GPUs the hello
    listed, so a GPU that appeared (the first snapshot failed at boot, a hot-add) or was
    swapped under its index is placeable only once a new hello lists it."""
    if said == now:
        return None
    before = {index for index, _ in said}
    after = {index for index, _ in now}
    swapped = sorted({index for index, _ in now - said} & before)
    parts = [f"{len(said)} listed by the hello, {len(now)} now"]
    for what, indexes in (
        ("added", sorted(after - before)),
        ("gone", sorted(before - after)),
        ("another UUID", swapped),
    ):
        if indexes:
            parts.append(f"{what}: {indexes}")
    return "GPU inventory changed (" + "; ".join(parts) + ")"
