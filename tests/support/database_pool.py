"""Fresh databases cloned from the migrated template ahead of the tests that take them.

Cloning costs a test 0.2 to 0.5 s on a busy machine (``benchmarks/database_clone.py``),
mostly in ``CREATE DATABASE ... TEMPLATE``. A pool clones the next ones in a task of its
own while a test runs, which mostly waits on processes and sockets, and drops the
databases given back the same way; a test then takes a database that is already there.

Each database is taken by one test only and never handed out again, so tests stay as
independent as when each cloned its own. A clone that fails (a server short of room, a
template someone is connected to) fails the one test that takes it, as its own clone
would have, and the pool clones again for the next. Every database the pool clones is dropped by
``close()``, taken or not, given back or not.

Each statement goes on a connection of its own (``PostgresServer``'s): while a clone's
connection was kept open and idle, a ``DROP DATABASE ... WITH (FORCE)`` on another once
waited for ever for it to accept a ProcSignalBarrier (PostgreSQL 15.18, in the benchmark).
"""

from __future__ import annotations

import asyncio
from collections import deque

from tests.support.postgres import PostgresServer, unique_database_name

POOL_SIZE = 2
"""Databases kept ready: one for the next test, one more for a test that comes quickly."""


class DatabasePool:
    """Clones of ``template`` on ``server``, ``size`` of them kept ready.

    ``start()`` and every other method run on one event loop: the pool's tasks run on it,
    while a test awaits. A clone that fails is raised by the ``take()`` that comes to it,
    a drop that fails by the next ``give_back()`` (once: the drops after it go on, and
    ``close()`` tries that database again), and the first of either by ``close()``: none is
    lost in the background.
    """

    def __init__(
        self,
        server: PostgresServer,
        template: str,
        size: int = POOL_SIZE,
        prefix: str = "llmgw_test",
    ) -> None:
        if size < 1:
            raise ValueError(f"a pool keeps at least one database ready, not {size}")
        self._server = server
        self._template = template
        self._prefix = prefix
        self._room = asyncio.Semaphore(size)
        self._ready: deque[str | Exception] = deque()
        """Clones made ahead, or why one failed, in the order the tests take them."""
        self._first_failure: Exception | None = None
        self._drop_failures: deque[Exception] = deque()
        """Drops that failed, each told to the ``give_back()`` that comes next."""
        self._to_drop: asyncio.Queue[str | None] = asyncio.Queue()
        self._cloned = asyncio.Event()
        """Set when a clone, or why one failed, is put in ``_ready``: what a ``take()``
        that found none waits for."""
        self._owned: set[str] = set()
        """Every database cloned and not yet dropped: what ``close()`` drops."""
        self._closing = False
        self._cloner: asyncio.Task[None] | None = None
        self._dropper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._cloner = asyncio.create_task(self._clone_ahead(), name="database pool: clone")
        self._dropper = asyncio.create_task(self._drop_given_back(), name="database pool: drop")

    @property
    def ready(self) -> int:
        """How many cloned databases wait for a test."""
        return sum(isinstance(entry, str) for entry in self._ready)

    async def take(self) -> str:
        """The name of a database cloned from the template that no one else was given. A
        caller cancelled while it waits (a test that timed out) takes none: the clone it
        waited for stays ready for the next, and the pool's room to clone with it."""
        cloner, dropper = self._tasks()
        _raise_if_failed(dropper)
        while not self._ready:
            if cloner.done():
                _raise_if_failed(cloner)
                raise RuntimeError("the database pool stopped cloning")
            # Wait for a clone, but take it only below, with no await between taking it
            # and returning it: a test cancelled while it waits takes nothing.
            self._cloned.clear()
            cloned = asyncio.ensure_future(self._cloned.wait())
            try:
                await asyncio.wait({cloned, cloner}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                cloned.cancel()
        entry = self._ready.popleft()
        self._room.release()
        if isinstance(entry, Exception):
            raise entry
        return entry

    def give_back(self, name: str) -> None:
        """Drop ``name`` (taken from this pool) in the background; raises the failure of a
        drop given back earlier, if one failed since."""
        _, dropper = self._tasks()
        _raise_if_failed(dropper)
        if name not in self._owned:
            raise ValueError(f"{name} is not a database of this pool")
        self._to_drop.put_nowait(name)
        if self._drop_failures:
            raise self._drop_failures.popleft()

    async def close(self) -> None:
        """Stop cloning, and drop every database this pool cloned. The clone in progress
        is let finish rather than cancelled, so that it cannot commit after its drop."""
        cloner, dropper = self._tasks()
        self._closing = True
        self._room.release()  # wakes the cloner if it waits for room
        self._to_drop.put_nowait(None)
        errors = []
        for task in (cloner, dropper):
            try:
                await task
            except Exception as exc:  # reported below, after the databases are dropped
                errors.append(exc)
        for name in sorted(self._owned):
            await self._server.drop_database(name)
        self._owned.clear()
        if errors:
            raise errors[0]
        if self._first_failure is not None:
            raise self._first_failure

    def _tasks(self) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        if self._cloner is None or self._dropper is None:
            raise RuntimeError("the database pool has not been started")
        return self._cloner, self._dropper

    async def _clone_ahead(self) -> None:
        while True:
            await self._room.acquire()
            if self._closing:
                return
            name = unique_database_name(self._prefix)
            self._owned.add(name)
            try:
                await self._server.create_database(name, template=self._template)
            except Exception as exc:  # the failure of the test that takes it, not all
                self._first_failure = self._first_failure or exc
                self._ready.append(exc)
            else:
                self._ready.append(name)
            self._cloned.set()

    async def _drop_given_back(self) -> None:
        while (name := await self._to_drop.get()) is not None:
            try:
                await self._server.drop_database(name)
            except Exception as exc:  # the failure of the teardown that comes next, not all
                self._first_failure = self._first_failure or exc
                self._drop_failures.append(exc)  # ``name`` stays owned: close() tries again
            else:
                self._owned.discard(name)


def _raise_if_failed(task: asyncio.Task[None]) -> None:
    if task.done() and not task.cancelled():
        error = task.exception()
        if error is not None:
            raise error
