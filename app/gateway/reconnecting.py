"""One connection to PostgreSQL kept open for as long as a gateway's task runs.

A gateway holds a few connections, each for one job (``app.gateway.source``'s snapshot
reads, ``app.gateway.reporter``'s reports, ``app.gateway.budget_keeper``'s grants), so
that a statement held up on one never holds up the others. Each job runs in a
``ConnectedTask``: connect, hand the connection to the job until it returns (the task is
stopping) or raises, and on a loss tell the job, wait with backoff, connect again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from time import monotonic

import asyncpg

BACKOFF_S = (0.1, 2.0)
CLOSE_WITHIN_S = 2.0
"""How long ``ConnectedTask.close`` lets its job end on its own before cancelling it."""
CONNECTION_LOST = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,  # also a schema that is not migrated yet: wait for it alike
    asyncpg.InterfaceError,
    # The driver's word for a connection it found broken only once it was in use (a
    # protocol state the cut left behind), not a bug of the job's.
    asyncpg.InternalClientError,
)
"""What a job raises when its connection, or the database behind it, has gone."""


Job = Callable[[asyncpg.Connection], Awaitable[None]]


def require_positive(*seconds: tuple[str, float]) -> None:
    """Raise ``ValueError`` naming the first of a job's timings (label, seconds), such as its
    turn's interval or its statement timeout, that is not positive."""
    for label, value in seconds:
        if value <= 0:
            raise ValueError(f"the {label} must be positive, not {value}")


class ConnectedTask:
    """One job's task and its connection: ``start`` runs the job on a fresh connection and
    again on a new one after each loss, ``close`` sets ``stop`` (and ``wake``, so a job
    waiting on it notices) and waits for the job to end, cancelling it after
    ``CLOSE_WITHIN_S``."""

    def __init__(self, url: str, *, application_name: str, timeout_s: float) -> None:
        self._url = url
        self._application_name = application_name
        self._timeout_s = timeout_s
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()
        """Set to make the job look again before its next turn."""
        self._task: asyncio.Task[None] | None = None

    def start(
        self,
        use: Job,
        *,
        lost: Callable[[BaseException], None],
        failed: Callable[[], None],
        settled: Callable[[], bool] = lambda: True,
    ) -> None:
        """Run ``use`` until it returns (``stop`` is set) unless it runs already.

        ``lost`` is told of every failure to connect and every loss. An exception that is
        not a lost connection is a bug: ``failed`` is called while it is handled (to log it
        with its traceback), and it is taken as a loss, so that it never ends the task.
        After a loss the next attempt comes ``BACKOFF_S[0]`` later when ``settled()`` says
        the connection had done its job (a database that went away once), else after a
        backoff doubled up to ``BACKOFF_S[1]`` (one that keeps refusing)."""
        if self._task is None:
            self._task = asyncio.create_task(
                self._keep_connected(use, lost, failed, settled), name=self._application_name
            )

    async def wait_turn(self, until: float) -> None:
        """Wait until ``until`` (``time.monotonic``), or less when woken (``wake``, which it
        clears, or ``stop``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(until - monotonic(), 0.0)):
                await self.wake.wait()
        self.wake.clear()

    async def wait_turn_on(self, db: asyncpg.Connection, until: float) -> bool:
        """``wait_turn`` for a job that works on ``db`` in turns: True when its turn has come
        (or it was woken), False when it is stopping or ``db`` closed meanwhile, for the job
        to look again. A ``db`` the database closed is a loss: ``ConnectionResetError``."""
        if db.is_closed():
            raise ConnectionResetError("the database closed the connection")
        await self.wait_turn(until)
        return not (self.stop.is_set() or db.is_closed())

    async def close(self) -> BaseException | None:
        """Stop the job; what it raised, if it ended on an exception."""
        task, self._task = self._task, None
        if task is None:
            return None
        self.stop.set()
        self.wake.set()
        await asyncio.wait({task}, timeout=CLOSE_WITHIN_S)
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_WITHIN_S)
        return None if task.cancelled() else task.exception()

    async def _keep_connected(
        self,
        use: Job,
        lost: Callable[[BaseException], None],
        failed: Callable[[], None],
        settled: Callable[[], bool],
    ) -> None:
        low, high = BACKOFF_S
        backoff = low
        while not self.stop.is_set():
            try:
                connection = await asyncpg.connect(
                    self._url,
                    timeout=self._timeout_s,
                    server_settings={"application_name": self._application_name},
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
                    await self.stop.wait()
            backoff = min(backoff * 2, high)
