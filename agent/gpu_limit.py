"""The most GPUs a node may report: ``MAX_GPUS_PER_NODE``, past which the control plane
refuses its hello.

A node that lists more could never connect: the hub refuses the hello (close 1002, which
an agent retries), so the agent would reconnect for ever. What the agent does instead
depends on when it finds them:

- at its start (``AgentRuntime.start``) it refuses to start, naming the count and the
  limit (exit 2): nothing runs yet that a refusal would cost, and the operator who starts
  it reads the reason at once;
- later (NVML lists GPUs added while it runs) it reports the first ``MAX_GPUS_PER_NODE``
  by index and logs a warning naming the GPUs it leaves out. Refusing then would take a
  serving node off the fleet: the node keeps the GPUs the control plane knows, and the
  next start of the agent refuses, as above.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.gpus import GpuStatus
from wire.messages import MAX_GPUS_PER_NODE


class GpusOverLimit(Exception):
    """The GPU source lists more GPUs than a node may report."""


def within_node_limit(
    gpus: Sequence[GpuStatus],
) -> tuple[tuple[GpuStatus, ...], tuple[GpuStatus, ...]]:
    """``gpus`` cut to the ``MAX_GPUS_PER_NODE`` lowest indexes, in their order, and the
    GPUs left out (none for a listing within the limit)."""
    if len(gpus) <= MAX_GPUS_PER_NODE:
        return tuple(gpus), ()
    kept = set(sorted(gpu.index for gpu in gpus)[:MAX_GPUS_PER_NODE])
    return (
        tuple(gpu for gpu in gpus if gpu.index in kept),
        tuple(gpu for gpu in gpus if gpu.index not in kept),
    )


def over_limit_refusal(listed: int) -> str:
    """Why an agent whose GPU source lists ``listed`` GPUs at its start does not start."""
    return (
        f"the GPU source lists {listed} GPUs; a node may report at most {MAX_GPUS_PER_NODE} "
        "(the control plane refuses a hello with more), so this agent could never connect"
    )
