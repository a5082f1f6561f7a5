"""Requests a router test started and may leave waiting, ended with the test."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_left(started: list[asyncio.Task[Any]]) -> None:
    """Cancels and awaits ``started``, then empties it: the tests share one loop, and a
    request a failed test left held or waiting must not outlive it."""
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)
    started.clear()
