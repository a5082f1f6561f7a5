"""Telling whether two NVML device handles name the same GPU."""

from __future__ import annotations

import ctypes


def same_device(known: object, handle: object) -> bool:
    """True when ``handle`` is ``known``, or points at the same NVML device.

    pynvml hands out a new pointer object on each call, but the device it points at is
    NVML's own and keeps its address for as long as NVML stays initialised."""
    if known is handle:
        return True
    if isinstance(known, ctypes._Pointer) and isinstance(handle, ctypes._Pointer):
        known_address = ctypes.cast(known, ctypes.c_void_p).value
        return known_address == ctypes.cast(handle, ctypes.c_void_p).value
    try:
        return bool(known == handle)
    except Exception:
        return False
