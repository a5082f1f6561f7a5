"""An event store in memory, for unit tests and tools: same interface, same contract.

``InMemoryRecorder`` keeps the log in a list and makes the checks ``llmgw_append`` makes in
PostgreSQL (the caller's position and the event at it, event ids, stream versions); the
store around it is the PostgreSQL store's (``app.store.folded``). Payloads go through the
same codec as in PostgreSQL, so upcasting and encoding behave alike; the contract suite in
``tests/contracts`` runs against both stores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from msgspec.structs import replace

from app.clock import utc_now
from app.domain.envelope import Envelope, Meta, Recorded
from app.domain.events import subjects
from app.domain.evolve import replay
from app.domain.replica_listing import WHOLE_LIST, ReplicaPage
from app.domain.state import ENDED_PHASES, ClusterState, Replica, ReplicaFilter
from app.store.codec import decode_event, encode_event
from app.store.errors import AlreadyRecorded, ConcurrencyError, LogMovedOn
from app.store.folded import FoldedEventStore
from app.store.projection import RowChanges


class StoredEvent(Envelope, frozen=True, kw_only=True):
    """An event as the in-memory log keeps it: its payload encoded, as PostgreSQL keeps it."""

    type: str
    schema_version: int
    data: bytes


class InMemoryRecorder:
    """The log as a list: ``log[n]`` is the event at position ``n + 1``."""

    def __init__(self) -> None:
        self.log: list[StoredEvent] = []
        self._versions: dict[str, int] = {}
        self._by_id: dict[UUID, StoredEvent] = {}

    def insert(self, stored: StoredEvent) -> None:
        self.log.append(stored)
        self._versions[stored.stream] = stored.version
        self._by_id[stored.event_id] = stored

    def keep_first(self, received: int) -> None:
        """Keep only the first ``received`` events: the log as a standby that had received
        no more holds it after a failover (tests of failover)."""
        kept = self.log[:received]
        self.log, self._versions, self._by_id = [], {}, {}
        for stored in kept:
            self.insert(stored)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[InMemoryRecorder]:
        yield self

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        yield  # one event loop, no await between the checks and the insert: nothing to lock

    async def events_after(self, position: int, limit: int) -> list[Recorded]:
        start = max(position, 0)
        return [_decode(s) for s in self.log[start : start + limit]]

    async def stream_versions(self, streams: Sequence[str]) -> dict[str, int]:
        return {s: self._versions[s] for s in streams if s in self._versions}

    async def events_with_ids(self, event_ids: Sequence[UUID]) -> list[Recorded]:
        return [_decode(self._by_id[i]) for i in dict.fromkeys(event_ids) if i in self._by_id]

    async def record(
        self,
        batch: Sequence[Recorded],
        rows: RowChanges,
        meta: Meta,
        after_position: int,
        after_event_id: UUID | None,
    ) -> dict[UUID, int]:
        last = self.log[-1].event_id if self.log else None
        if after_position != len(self.log) or after_event_id != last:
            raise LogMovedOn()
        if any(r.event_id in self._by_id for r in batch):
            raise AlreadyRecorded()
        first: dict[str, int] = {}
        for recorded in batch:
            first.setdefault(recorded.stream, recorded.version)
        for stream, version in first.items():
            actual = self._versions.get(stream, 0)
            if actual != version - 1:
                raise ConcurrencyError(stream, None, actual)
        positions: dict[UUID, int] = {}
        for recorded in batch:
            type_name, schema_version, data = encode_event(recorded.event)
            placed = replace(recorded, position=len(self.log) + 1, meta=meta)
            stored = StoredEvent(
                **_envelope(placed), type=type_name, schema_version=schema_version, data=data
            )
            self.insert(stored)
            positions[stored.event_id] = stored.position
        return positions

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]:
        return [_decode(s) for s in self.log if s.stream == stream and s.version > after_version]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]:
        return await self.events_after(after_position, limit)

    async def read_correlated(
        self, correlation_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Recorded]:
        matching = [s for s in self.log if s.meta.correlation_id == correlation_id]
        chosen = matching[max(len(matching) - limit, 0) :] if newest else matching[:limit]
        return [_decode(s) for s in chosen]

    async def read_about_replica(self, replica_id: str) -> list[Recorded]:
        decoded = (_decode(s) for s in self.log)
        return [r for r in decoded if subjects(r.event).replica == replica_id]

    async def forgotten_replicas(
        self, known: Collection[str], among: ReplicaFilter, page: ReplicaPage = WHOLE_LIST
    ) -> list[Replica]:
        forgotten, _ = self._every_replica()
        return page.of(
            r
            for r in forgotten.values()
            if r.id not in known and r.phase in ENDED_PHASES and among.matches(r)
        )

    async def any_ended_replica(self, among: ReplicaFilter) -> bool:
        forgotten, held = self._every_replica()
        anyhow = replace(among, ended=True)
        every = [*forgotten.values(), *held.values()]
        return any(r.phase in ENDED_PHASES and anyhow.matches(r) for r in every)

    async def ended_replicas_by_model(self, before: datetime) -> dict[str, int]:
        forgotten, held = self._every_replica()
        counts: dict[str, int] = {}
        for replica in (forgotten | held).values():
            ended_at = replica.ended_at
            if replica.phase in ENDED_PHASES and ended_at is not None and ended_at <= before:
                counts[replica.model] = counts.get(replica.model, 0) + 1
        return counts

    def _every_replica(self) -> tuple[dict[str, Replica], dict[str, Replica]]:
        """The replicas the fold forgot (each as last forgotten) and those it holds, by id:
        no tables here, so a replay that keeps what it forgets stands for them (tests and
        tools only)."""
        state = ClusterState()
        state.forgotten = []
        replay((_decode(s) for s in self.log), state)
        return {r.id: r for r in state.forgotten}, dict(state.replicas)

    async def stream_version(self, stream: str) -> int:
        return self._versions.get(stream, 0)

    async def last_position(self) -> int:
        return len(self.log)


class InMemoryEventStore(FoldedEventStore):
    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self._log = InMemoryRecorder()
        super().__init__(self._log, clock=clock)

    def insert_raw(self, stored: StoredEvent) -> None:
        """Put a payload in the log as written by an older version (tests of upcasting)."""
        self._log.insert(stored)

    @property
    def recorder(self) -> InMemoryRecorder:
        """The log, for tests that write to it behind the store's back, as another process
        or a failover would."""
        return self._log


def _decode(stored: StoredEvent) -> Recorded:
    event = decode_event(stored.position, stored.type, stored.schema_version, stored.data)
    return Recorded(**_envelope(stored), event=event)


def _envelope(source: Envelope) -> dict[str, Any]:
    """The envelope of ``source``, to build the event's other form from."""
    return {name: getattr(source, name) for name in Envelope.__struct_fields__}
