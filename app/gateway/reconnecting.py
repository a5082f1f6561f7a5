"""One connection to PostgreSQL kept open for as long as a gateway's task runs.

A gateway holds a few connections, each for one job (``app.gateway.source``'s snapshot
reads, ``app.gateway.reporter``'s reports, ``app.gateway.budget_keeper``'s grants), so
that a statement held up on one never holds up the others. Each job runs through
``keep_connected``: connect, hand the connection to the job until it returns (the task is
stopping) or raises, and on a loss tell the job, wait with backoff, connect again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import asyncpg

BACKOFF_S = (0.1, 2.0)
CONNECTION_LOST = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,  # also a schema that is not migrated yet: wait for it alike
    asyncpg.InterfaceError,
)
"""What a job raises when its connection, or the database behind it, has gone."""


async def keep_connected(
    url: str,
    *,
    application_name: str,
    timeout_s: float,
    stop: asyncio.Event,
    use: Callable[[asyncpg.Connection], Awaitable[None]],
    lost: Callable[[BaseException], None],
    failed: Callable[[], None],
    settled: Callable[[], bool] = lambda: True,
) -> None:
    """Run ``use`` on a fresh connection until it returns or ``stop`` is set.

    ``lost`` is told of every failure to connect and every loss. An exception that is not
    a lost connection is a bug: ``failed`` is called while it is handled (to log it with
    its traceback), and it is taken as a loss, so that it never ends the task. After a loss
    the next attempt comes ``BACKOFF_S[0]`` later when ``settled()`` says the connection
    had done its job (a database that went away once), else after a backoff doubled up to
    ``BACKOFF_S[1]`` (one that keeps refusing)."""
    low, high = BACKOFF_S
    backoff = low
    while not stop.is_set():
        try:
            connection = await asyncpg.connect(
                url, timeout=timeout_s, server_settings={"application_name": application_name}
            )
        except CONNECTION_LOST as exc:
            lost(exc)
        else:
            try:
                await use(connection)
                return  # stopping
            except CONNECTION_LOST as exc:
                lost(exc)
            except Exception as exc:  # a bug must not end the loop: retry as if lost
                failed()
                lost(exc)
            finally:
                connection.terminate()
            if settled():
                backoff = low
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(backoff):
                await stop.wait()
        backoff = min(backoff * 2, high)


async def stop_task(task: asyncio.Task[None] | None, within_s: float) -> None:
    """Wait up to ``within_s`` for ``task`` to end on its own (its stop event set), then
    cancel it until it does."""
    if task is None:
        return
    await asyncio.wait({task}, timeout=within_s)
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=within_s)
