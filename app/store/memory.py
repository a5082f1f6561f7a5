"""An event store in memory, for unit tests and tools: same interface, same contract.

Payloads go through the same codec as in PostgreSQL, so upcasting and encoding behave
alike; the contract suite in ``tests/contracts`` runs against both stores.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from uuid import UUID

import msgspec

from app.domain.envelope import Meta, Recorded
from app.domain.evolve import evolve
from app.domain.state import ClusterState
from app.store.codec import decode_event, encode_event
from app.store.errors import ConcurrencyError
from app.store.interface import AppendRequest, NewEvent


class StoredEvent(msgspec.Struct, frozen=True):
    position: int
    stream: str
    version: int
    event_id: UUID
    recorded_at: datetime
    meta: Meta
    type: str
    schema_version: int
    data: bytes


def _utc_now() -> datetime:
    return datetime.now(UTC)


class InMemoryEventStore:
    def __init__(self, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._log: list[StoredEvent] = []
        self._versions: dict[str, int] = {}
        self._by_id: dict[UUID, StoredEvent] = {}
        self._lock = asyncio.Lock()
        self._state = ClusterState()
        self.appended = asyncio.Event()

    @property
    def state(self) -> ClusterState:
        return self._state

    def insert_raw(self, stored: StoredEvent) -> None:
        """Put a payload in the log as written by an older version (tests of upcasting)."""
        self._log.append(stored)
        self._versions[stored.stream] = stored.version
        self._by_id[stored.event_id] = stored

    async def append(
        self, stream: str, expected_version: int | None, events: Sequence[NewEvent], meta: Meta
    ) -> list[Recorded]:
        return await self.append_many([AppendRequest(stream, expected_version, events)], meta)

    async def append_many(self, requests: Sequence[AppendRequest], meta: Meta) -> list[Recorded]:
        async with self._lock:
            plan: list[tuple[str, int, NewEvent]] = []
            existing: list[StoredEvent] = []
            versions = dict(self._versions)
            for request in requests:
                fresh = [e for e in request.events if e.event_id not in self._by_id]
                known = [e for e in request.events if e.event_id in self._by_id]
                existing += [self._by_id[e.event_id] for e in known]
                if not fresh:
                    continue
                actual = versions.get(request.stream, 0)
                expected = request.expected_version
                if expected is not None and expected != actual:
                    raise ConcurrencyError(request.stream, expected, actual)
                for offset, new in enumerate(fresh, start=1):
                    plan.append((request.stream, actual + offset, new))
                versions[request.stream] = actual + len(fresh)
            now = self._clock()
            recorded: list[Recorded] = []
            for stream, version, new in plan:
                type_name, schema_version, data = encode_event(new.event)
                stored = StoredEvent(
                    position=len(self._log) + 1,
                    stream=stream,
                    version=version,
                    event_id=new.event_id,
                    recorded_at=now,
                    meta=meta,
                    type=type_name,
                    schema_version=schema_version,
                    data=data,
                )
                self.insert_raw(stored)
                recorded.append(_decode(stored))
            await self.catch_up()
            if recorded:
                self.appended.set()
            return [_decode(s) for s in existing] + recorded

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]:
        return [_decode(s) for s in self._log if s.stream == stream and s.version > after_version]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]:
        start = max(after_position, 0)
        return [_decode(s) for s in self._log[start : start + limit]]

    async def read_correlated(self, correlation_id: str, limit: int = 1000) -> list[Recorded]:
        matching = (s for s in self._log if s.meta.correlation_id == correlation_id)
        return [_decode(s) for s in itertools.islice(matching, limit)]

    def known_version(self, stream: str) -> int:
        return self._versions.get(stream, 0)

    async def stream_version(self, stream: str) -> int:
        return self._versions.get(stream, 0)

    async def last_position(self) -> int:
        return len(self._log)

    async def catch_up(self) -> ClusterState:
        for stored in self._log[self._state.position :]:
            evolve(self._state, _decode(stored))
        return self._state


def _decode(stored: StoredEvent) -> Recorded:
    return Recorded(
        position=stored.position,
        stream=stored.stream,
        version=stored.version,
        event_id=stored.event_id,
        recorded_at=stored.recorded_at,
        meta=stored.meta,
        event=decode_event(stored.position, stored.type, stored.schema_version, stored.data),
    )
