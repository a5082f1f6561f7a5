"""The node's GPUs: discovery, inventory and health, from NVML or declared fakes.

``open_gpu_source`` picks the source; ``GpuSource.snapshot()`` lists the GPUs with their
health and the XID events seen since the previous snapshot. docs/gpus.md has the rules.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path

from agent.gpus.fake import FakeGpuSource, parse_fake_gpus
from agent.gpus.fake_health import declare_fake_gpus, mark_fake_gpu
from agent.gpus.health import DEFAULT_XID_RECOVERY
from agent.gpus.nvml import NvmlGpuSource, UnavailableNvml
from agent.gpus.types import GpuSnapshot, GpuSource, GpuStatus, XidEvent
from agent.gpus.xid import XidClass, classify_xid

__all__ = [
    "DEFAULT_XID_RECOVERY",
    "FakeGpuSource",
    "GpuSnapshot",
    "GpuSource",
    "GpuStatus",
    "NvmlGpuSource",
    "XidClass",
    "XidEvent",
    "classify_xid",
    "mark_fake_gpu",
    "open_gpu_source",
    "parse_fake_gpus",
]


def open_gpu_source(
    fake_spec: str | None,
    health_file: Path | None,
    node_seed: str,
    *,
    xid_recovery: timedelta = DEFAULT_XID_RECOVERY,
) -> GpuSource:
    """Fake GPUs when ``fake_spec`` is given (``"4x80GB"``), otherwise NVML. NVML on a
    machine without the driver reports no GPUs and says why; it never raises for that.

    With a ``health_file``, how many fake GPUs there are (none for NVML) and their memory
    is written beside it, for ``llmgw-agent fake-gpu mark`` and ``use`` to refuse an index
    the node lacks, and ``use`` more MiB than its GPU has."""
    fake_gpus = None if fake_spec is None else parse_fake_gpus(fake_spec, seed=node_seed)
    if health_file is not None:
        # Without the declaration `mark` only knows less; the agent still runs.
        with contextlib.suppress(OSError):
            declare_fake_gpus(
                health_file,
                None if fake_gpus is None else len(fake_gpus),
                memory_mib=fake_gpus[0].memory_total_mib if fake_gpus else None,
            )
    if fake_gpus is not None:
        return FakeGpuSource(fake_gpus, health_file)
    try:
        import pynvml
    except ImportError as exc:
        return UnavailableNvml(f"no NVML: no GPUs discovered (cannot import pynvml: {exc})")
    return NvmlGpuSource(pynvml, xid_recovery=xid_recovery)
