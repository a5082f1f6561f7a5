"""XID error codes: what each means and whether it makes the GPU unhealthy.

The driver reports an XID when something goes wrong on a GPU. Some are faults of the
program that was running (a bad memory access in a CUDA kernel): the driver tears down
that program's context and the GPU carries on. Others mean the hardware, its firmware or
the driver needs attention, usually a GPU reset. The meanings follow NVIDIA's XID
catalogue; docs/gpus.md lists the table and marks the entries that are less certain.

An XID missing from the table is treated as making the GPU unhealthy: a GPU that shows
an error nobody has classified should not take new work until the recovery window has
passed quietly. This matches NVIDIA's Kubernetes device plugin, which treats every XID
it does not know to be an application error as critical.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class XidClass(StrEnum):
    """Where the fault lies."""

    APPLICATION = "application"
    HARDWARE = "hardware"
    DRIVER = "driver"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    classification: XidClass
    description: str
    marks_unhealthy: bool


def _app(code: int, description: str) -> XidInfo:
    return XidInfo(code, XidClass.APPLICATION, description, marks_unhealthy=False)


def _hardware(code: int, description: str) -> XidInfo:
    return XidInfo(code, XidClass.HARDWARE, description, marks_unhealthy=True)


def _driver(code: int, description: str) -> XidInfo:
    return XidInfo(code, XidClass.DRIVER, description, marks_unhealthy=True)


_ENTRIES = (
    _driver(8, "GPU stopped processing"),
    _app(13, "graphics engine exception"),
    _app(31, "GPU memory page fault"),
    _hardware(32, "invalid or corrupted push buffer stream"),
    _driver(38, "driver firmware error"),
    _app(43, "GPU stopped processing"),
    _driver(44, "graphics engine fault during context switch"),
    _app(45, "preemptive cleanup, due to previous errors"),
    _hardware(48, "double-bit ECC error"),
    _hardware(54, "auxiliary power is not connected to the GPU board"),
    _hardware(57, "error programming video memory interface"),
    _hardware(58, "unstable video memory interface detected"),
    _driver(61, "internal micro-controller breakpoint/warning"),
    _driver(62, "internal micro-controller halt"),
    _hardware(63, "ECC page retirement or row remapping recording event"),
    _hardware(64, "ECC page retirement or row remapper recording failure"),
    _app(68, "video decoder (NVDEC0) exception"),
    _driver(69, "graphics engine class error"),
    _hardware(74, "NVLink error"),
    _hardware(79, "GPU has fallen off the bus"),
    _hardware(80, "corrupted data sent to GPU"),
    _hardware(81, "VGA subsystem error"),
    _hardware(92, "high single-bit ECC error rate"),
    XidInfo(
        93,
        XidClass.HARDWARE,
        "non-fatal violation of provisioned InfoROM wear limit",
        marks_unhealthy=False,
    ),
    _hardware(94, "contained ECC error"),
    _hardware(95, "uncontained ECC error"),
    _app(109, "context switch timeout"),
    _driver(110, "security fault error"),
    _driver(119, "GSP RPC timeout"),
    _driver(120, "GSP error"),
    _hardware(121, "C2C link error"),
    _driver(122, "SPI PMU RPC read failure"),
    _driver(123, "SPI PMU RPC write failure"),
    _driver(124, "SPI PMU RPC erase failure"),
    _hardware(140, "unrecovered ECC error"),
    _driver(143, "GPU initialization failure"),
    _hardware(154, "GPU recovery action changed"),
)

XID_TABLE: dict[int, XidInfo] = {entry.code: entry for entry in _ENTRIES}


def classify_xid(code: int) -> XidInfo:
    """The table's entry for ``code``, or the unknown-XID default (unhealthy)."""
    known = XID_TABLE.get(code)
    if known is not None:
        return known
    return XidInfo(code, XidClass.UNKNOWN, "unknown XID, not in the catalogue", True)


def xid_reason(code: int) -> str:
    """How a GPU held unhealthy by ``code`` explains itself: ``XID 79: GPU has fallen off
    the bus``."""
    return f"XID {code}: {classify_xid(code).description}"
