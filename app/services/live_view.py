"""The live fleet view: what connected agents say runs, kept beside the log.

``LiveView`` sits between the agent hub and the ``ReportRecorder``: the hub hands it every
report; it folds the report into the view (``app.domain.fleet_view.observe``) and passes it
on, so the log records it as before.

The reconciler decides on the log and the view together, so it must never see one without
the other: a hello in the view whose ``node_connected`` is not appended yet makes a stray
on a new node go unrecorded, and a ``node_connected`` whose hello is not in the view reads
as a node that never came back. ``quiet()`` gives that guarantee: inside it no report is
half recorded, and reports that arrive wait until it ends (they may run together with
each other otherwise). That gate is all this class adds to the pure fold.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from app.domain.fleet_view import FleetView, ModelOf, observe
from app.domain.reports import AgentReport


class ReportHandler(Protocol):
    """What reports go on to: ``app.services.agent_reports.ReportRecorder``."""

    async def handle(self, report: AgentReport) -> None: ...


class LiveView:
    def __init__(self, recorder: ReportHandler, *, model_of: ModelOf = lambda _: None) -> None:
        self._recorder = recorder
        self._model_of = model_of
        self._view = FleetView()
        self._listeners: list[Callable[[], None]] = []
        self._gate = _Gate()

    def snapshot(self) -> FleetView:
        """The view now; never changed afterwards (a change builds a new one)."""
        return self._view

    def greeting(self, node_id: str) -> int | None:
        """A number that changes with every hello of the node; None while it is away."""
        return self._view.greeting(node_id)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every report that changed the view."""
        self._listeners.append(listener)

    def quiet(self) -> AbstractAsyncContextManager[None]:
        """``async with view.quiet():`` read the log's state and ``snapshot()`` in step."""
        return self._gate.exclusive()

    async def handle(self, report: AgentReport) -> None:
        async with self._gate.shared():
            before = self._view
            self._view = observe(before, report, self._model_of)
            try:
                await self._recorder.handle(report)
            finally:
                if self._view is not before:
                    for listener in self._listeners:
                        listener()


class _Gate:
    """Many observers at once, or one reader alone. A waiting reader holds new observers
    back, so a steady stream of observations cannot starve the reconciler. Leaving either
    side takes no await, so a cancelled observer or reader cannot leave the gate shut."""

    def __init__(self) -> None:
        self._observing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._reader = asyncio.Lock()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while not self._open.is_set():
            await self._open.wait()
        self._observing += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._observing -= 1
            if self._observing == 0:
                self._idle.set()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._reader:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()
