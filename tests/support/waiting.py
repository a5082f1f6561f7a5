"""Waiting for a condition with a deadline: tests never sleep a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    within_s: float = 10.0,
    every_s: float = 0.02,
    what: str = "condition",
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {within_s}s")
        await asyncio.sleep(every_s)


def wait_until_blocking(
    condition: Callable[[], bool],
    *,
    within_s: float = 10.0,
    every_s: float = 0.02,
    what: str = "condition",
) -> None:
    """``wait_until`` for a test without an event loop (one that drives a blocking client)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {within_s}s")
        time.sleep(every_s)
