"""Which GPUs of a node an operator cordoned, and how placement says so.

A cordoned GPU takes no new shard (``app.domain.allocation`` leaves it out of what is
free, the one rule every placement question uses); a shard already on it keeps running
until an operator drains its replica. A cordon is the GPU's: it is recorded with the UUID
the node lists under the index cordoned, and follows that GPU to another index
(``app.domain.gpu_identity``), as GPU health does, and stays while the node does not list
its GPU (``unlisted_cordons``: one pulled out of the machine), so that it still holds if
the GPU comes back; an operator can lift it all the same. A node keeps at most
``MAX_GPU_CORDONS``. The operator's request is decided in ``app.domain.node_operations``
(``cordon_gpu``, ``uncordon_gpu``).
"""

from __future__ import annotations

from app.domain.gpu_identity import NumberedGpu, same_gpu
from app.domain.spec_bounds import MAX_GPUS_PER_SHARD
from app.domain.state import GpuCordon, Node

MAX_GPU_CORDONS = MAX_GPUS_PER_SHARD
"""The most GPU cordons a node keeps: as many GPUs as it may list (``MAX_GPUS_PER_SHARD``
is kept equal to that by a test). Only cordons of GPUs it no longer lists can add up past
its GPUs, so a cordon beyond it is refused until an operator lifts one of those."""


def cordon_of(node: Node, gpu: NumberedGpu) -> GpuCordon | None:
    """The cordon of the node's GPU ``gpu``, if an operator cordoned it."""
    for cordon in node.gpu_cordons:
        if same_gpu(cordon, index=gpu.index, uuid=gpu.uuid):
            return cordon
    return None


def unlisted_cordons(node: Node) -> tuple[GpuCordon, ...]:
    """The node's cordons of GPUs it does not list now, in the order they were cordoned:
    each under the index and UUID its GPU had when cordoned."""
    return tuple(
        cordon
        for cordon in node.gpu_cordons
        if not any(same_gpu(cordon, index=gpu.index, uuid=gpu.uuid) for gpu in node.gpus)
    )


def cordoned_indexes(node: Node) -> frozenset[int]:
    """The indexes under which the node lists a GPU an operator cordoned."""
    if not node.gpu_cordons:
        return frozenset()
    return frozenset(gpu.index for gpu in node.gpus if cordon_of(node, gpu) is not None)


def cordon_text(gpu_index: int, cordon: GpuCordon) -> str:
    """``GPU 3 cordoned by alice: ecc errors``, as placement's explanation says it of the
    GPU the node lists under ``gpu_index``."""
    reason = f": {cordon.reason}" if cordon.reason else ""
    return f"GPU {gpu_index} cordoned by {cordon.by}{reason}"
