"""One GPU's health checks through NVML (docs/gpus.md): retired pages pending, row
remapping pending or failed, volatile uncorrectable ECC errors. A check the GPU does not
support (ECC and row remapping on consumer GPUs) is skipped; any other error it meets is
a problem in its own words. A lost GPU or driver ends the reading (``nvml_calls``)."""

from __future__ import annotations

from agent.gpus.nvml_api import NvmlLibrary
from agent.gpus.nvml_calls import CallFailed, ask_gpu

RETIRED_PAGES_PENDING = "retired pages pending: a GPU reset is needed to retire them"
ROW_REMAP_PENDING = "row remapping pending: a GPU reset is needed to apply it"
ROW_REMAP_FAILED = "row remapping failed: a faulty memory row could not be remapped"


def health_problems(nvml: NvmlLibrary, handle: object) -> list[str]:
    """What is wrong with the GPU of ``handle``, in words; empty when nothing is."""
    problems: list[str] = []
    for check in (_retired_pages, _row_remapping, _uncorrected_ecc):
        try:
            problems.extend(check(nvml, handle))
        except CallFailed as failed:
            if not failed.unsupported:
                problems.append(failed.reason)
    return problems


def _retired_pages(nvml: NvmlLibrary, handle: object) -> list[str]:
    pending = ask_gpu(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    return [RETIRED_PAGES_PENDING] if pending else []


def _row_remapping(nvml: NvmlLibrary, handle: object) -> list[str]:
    _corrected, _uncorrected, pending, failed = ask_gpu(
        nvml, nvml.nvmlDeviceGetRemappedRows, handle
    )
    problems: list[str] = []
    if pending:
        problems.append(ROW_REMAP_PENDING)
    if failed:
        problems.append(ROW_REMAP_FAILED)
    return problems


def _uncorrected_ecc(nvml: NvmlLibrary, handle: object) -> list[str]:
    count = ask_gpu(
        nvml,
        nvml.nvmlDeviceGetTotalEccErrors,
        handle,
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
    )
    if count <= 0:
        return []
    return [f"{count} uncorrectable ECC error(s) since the last GPU reset"]
