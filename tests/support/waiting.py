"""Waiting for a condition with a deadline: tests never sleep a fixed time."""

from __future__ import annotations

import asyncio
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
