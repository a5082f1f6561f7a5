"""Calling NVML: its errors turned into what they mean for the GPU or for NVML itself.

Exception
├── Unreadable       the query leaves the GPU unhealthy; ``reason`` says why
│   ├── GpuLost      the GPU has fallen off the bus (``GpuIsLost``, ``Unknown``)
│   └── CallFailed   any other NVML error; ``unsupported`` for a check to skip
└── DriverLost       NVML itself no longer works (``Uninitialized``, no driver)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from agent.gpus.nvml_api import (
    DRIVER_LOST_CODES,
    LOST_CODES,
    UNSUPPORTED_CODES,
    NvmlLibrary,
    error_code,
    error_message,
)

P = ParamSpec("P")
T = TypeVar("T")


class Unreadable(Exception):
    """A query that leaves the GPU unhealthy; ``reason`` says why in words."""

    @property
    def reason(self) -> str:
        return str(self)


class GpuLost(Unreadable):
    pass


class CallFailed(Unreadable):
    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"NVML {function} failed: {message}")
        self.function = function
        self.code = code
        self.message = message

    @property
    def unsupported(self) -> bool:
        return self.code in UNSUPPORTED_CODES


class DriverLost(Exception):
    """NVML answered a call as one that has lost its driver; ``why`` in NVML's words."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def ask(nvml: NvmlLibrary, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call``'s answer; ``CallFailed`` for an NVML error, ``DriverLost`` for one that
    says NVML itself no longer works."""
    try:
        return call(*args, **kwargs)
    except nvml.NVMLError as exc:
        code = error_code(exc)
        if code in DRIVER_LOST_CODES:
            raise DriverLost(error_message(exc)) from exc
        function = getattr(call, "__name__", "call")
        raise CallFailed(function, code, error_message(exc)) from exc


def ask_gpu(nvml: NvmlLibrary, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Like ``ask``, but a lost GPU stops the reading of that GPU at once."""
    try:
        return ask(nvml, call, *args, **kwargs)
    except CallFailed as failed:
        if failed.code in LOST_CODES:
            raise GpuLost(
                f"GPU is lost: NVML {failed.function} answered '{failed.message}'"
            ) from failed
        raise
