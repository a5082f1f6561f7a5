"""The live fleet view: what connected agents say runs, kept beside the log.

``FleetViewTracker`` sits between the agent hub and ``FleetService``: the hub hands it every
observation (it has the same ``handle`` as the service), it updates the view and passes the
observation on, so the log records it as before. What it keeps per node:

- hello: the node's report is replaced by the hello's shard inventory;
- heartbeat: the states of the shards it lists that the view knows (a heartbeat carries no
  port, so a shard the view does not know waits for its status or the next hello);
- shard status: that shard, inserted or updated; ``stopped`` and ``failed`` keep the shard
  with that state, which takes it out of the running set;
- agent gone: the node's report is dropped.

The reconciler decides on the log and the view together, so it must never see one without
the other: a hello in the view whose ``node_connected`` is not appended yet makes a stray
on a new node go unrecorded, and a ``node_connected`` whose hello is not in the view reads
as a node that never came back. ``quiet()`` gives that guarantee: inside it no observation
is half recorded, and observations that arrive wait until it ends (they may run together
with each other otherwise).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from app.domain.fleet_view import FleetView, NodeReport, ReportedShard
from app.fleet.hub import ObservationHandler
from app.fleet.messages import Heartbeat, Hello, ShardStatus
from app.fleet.session import (
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    Observation,
    ShardStatusReported,
)

ModelOf = Callable[[str], str | None]
"""The model of a replica the log knows; a shard status does not carry it."""

ShardKey = tuple[str, int]


class FleetViewTracker:
    def __init__(self, service: ObservationHandler, *, model_of: ModelOf = lambda _: None) -> None:
        self._service = service
        self._model_of = model_of
        self._reports: dict[str, NodeReport] = {}
        self._view = FleetView()
        self._greetings: dict[str, int] = {}
        self._hello_numbers = itertools.count(1)
        self._listeners: list[Callable[[], None]] = []
        self._gate = _Gate()

    def snapshot(self) -> FleetView:
        """The view now; never changed afterwards (a change builds a new one)."""
        return self._view

    def greeting(self, node_id: str) -> int | None:
        """A number that changes with every hello of the node; None while it is away."""
        return self._greetings.get(node_id)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every observation that changed the view."""
        self._listeners.append(listener)

    def quiet(self) -> AbstractAsyncContextManager[None]:
        """``async with tracker.quiet():`` read the log's state and ``snapshot()`` in step."""
        return self._gate.exclusive()

    async def handle(
        self, node_id: str, observation: Observation, *, replaced_previous: bool = False
    ) -> None:
        async with self._gate.shared():
            changed = self._apply(observation)
            try:
                await self._service.handle(
                    node_id, observation, replaced_previous=replaced_previous
                )
            finally:
                if changed:
                    for listener in self._listeners:
                        listener()

    def _apply(self, observation: Observation) -> bool:
        match observation:
            case AgentHello(node_id=node_id, hello=hello):
                self._greetings[node_id] = next(self._hello_numbers)
                self._set(node_id, _inventory(hello))
                return True
            case AgentHeartbeat(node_id=node_id, heartbeat=heartbeat):
                return self._heartbeat(node_id, heartbeat)
            case ShardStatusReported(node_id=node_id, status=status):
                return self._shard_status(node_id, status)
            case AgentGone(node_id=node_id):
                self._greetings.pop(node_id, None)
                if self._reports.pop(node_id, None) is None:
                    return False
                self._view = FleetView(reports=dict(self._reports))
                return True
            case _:
                return False

    def _heartbeat(self, node_id: str, heartbeat: Heartbeat) -> bool:
        report = self._reports.get(node_id)
        if report is None:
            return False
        shards = dict(report.shards)
        for listed in heartbeat.shards:
            known = shards.get((listed.replica_id, listed.shard_index))
            if known is not None and known.state != listed.state:
                shards[(known.replica_id, known.shard_index)] = _with_state(known, listed.state)
        if shards == report.shards:
            return False
        self._set(node_id, shards)
        return True

    def _shard_status(self, node_id: str, status: ShardStatus) -> bool:
        report = self._reports.get(node_id)
        shards = dict(report.shards) if report is not None else {}
        key = (status.replica_id, status.shard_index)
        known = shards.get(key)
        shards[key] = ReportedShard(
            replica_id=status.replica_id,
            shard_index=status.shard_index,
            model=known.model if known else self._model_of(status.replica_id) or "",
            port=status.port,
            pid=status.pid if status.pid is not None else (known.pid if known else None),
            state=status.state,
        )
        if known == shards[key]:
            return False
        self._set(node_id, shards)
        return True

    def _set(self, node_id: str, shards: dict[ShardKey, ReportedShard]) -> None:
        self._reports[node_id] = NodeReport(node_id=node_id, shards=shards)
        self._view = FleetView(reports=dict(self._reports))


def _inventory(hello: Hello) -> dict[ShardKey, ReportedShard]:
    return {
        (s.replica_id, s.shard_index): ReportedShard(
            replica_id=s.replica_id,
            shard_index=s.shard_index,
            model=s.model,
            port=s.port,
            pid=s.pid,
            state=s.state,
        )
        for s in hello.shards
    }


def _with_state(shard: ReportedShard, state: str) -> ReportedShard:
    return ReportedShard(
        replica_id=shard.replica_id,
        shard_index=shard.shard_index,
        model=shard.model,
        port=shard.port,
        pid=shard.pid,
        state=state,
    )


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
