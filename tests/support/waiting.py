"""Waiting for a condition with a deadline: tests never sleep a fixed time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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


def outcome_within(
    call: Callable[[], object],
    *,
    within_s: float = 10.0,
    unblock: Callable[[], None] = lambda: None,
    what: str = "call",
) -> object:
    """What ``call`` returned, or the exception it raised, run in a thread that is given
    ``within_s`` seconds: a call that would wait for ever (opening a FIFO no program writes
    to) fails the test instead of hanging the suite, and ``unblock`` then lets it end."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # the outcome is what the test asserts
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within_s)
    if thread.is_alive():
        unblock()
        thread.join(within_s)
        raise AssertionError(f"{what} did not end within {within_s}s")
    return outcome[0]


def open_fifo_writer_briefly(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it: a reader waiting in its open is let go."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, T]) -> AsyncIterator[asyncio.Task[T]]:
    """``work`` runs as a task while the block waits on what it does; cancelled, and
    awaited, when the block ends (an agent's dial loop runs for ever)."""
    task = asyncio.create_task(work)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
