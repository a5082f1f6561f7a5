"""The event store in PostgreSQL: events, projection rows and checkpoint in one transaction.

An append is one call of the ``llmgw_append`` function (migration 0002): it takes the
append lock, checks that the caller's fold is current, that no event id is already
stored and that every stream is at the version the caller expects, inserts the events,
replaces the projection rows of every entity they touch, moves the checkpoint and
notifies listeners, all in one statement and so one transaction. Why appends are
serialized, and why this is one round trip, is explained there.

The version check runs here first, against the stream versions of the in-memory fold, so a
writer that loses a race is refused before anything reaches the database and consumes no
position: it leaves no hole. (A transaction that fails after inserting, a lost connection
say, does leave a gap in ``position``; readers never wait for gaps, they rely only on
positions becoming visible in commit order, so a gap cannot stall them.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec
from msgspec.structs import replace
from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta, Recorded
from app.domain.evolve import evolve
from app.domain.state import ClusterState
from app.store import history
from app.store.codec import (
    RECORDED_COLUMNS,
    encode_event,
    encode_meta,
    record_from_row,
    storable,
)
from app.store.database import connection
from app.store.errors import ConcurrencyError, FencedError, StoreError
from app.store.interface import AppendRequest, NewEvent
from app.store.projection import RowChanges, fold
from app.store.tables import PROJECTION_TABLES

APPEND_LOCK_KEY = 0x6C6C6D67_77000001  # "llmgw" + 1: one key for the whole log
NOTIFY_CHANNEL = "llmgw_events"
CHECKPOINT = "main"

_SELECT_EVENTS = f"SELECT {RECORDED_COLUMNS} FROM events"

_APPEND_CALL = (
    "SELECT out_position, out_event_id FROM llmgw_append($1, $2, $3::text[], $4::int[], "
    "$5::text[], $6::smallint[], $7::jsonb[], $8::uuid[], $9::text[], $10::text[], "
    "$11::text[], $12::jsonb, $13, $14, $15, $16::text[], $17::text[], $18::text[], "
    "$19::text[], $20::jsonb, $21)"
)
_encoder = msgspec.json.Encoder()


def _utc_now() -> datetime:
    return datetime.now(UTC)


class PostgresEventStore:
    def __init__(
        self,
        engine: AsyncEngine,
        clock: Callable[[], datetime] = _utc_now,
        notify_channel: str = NOTIFY_CHANNEL,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._channel = notify_channel
        self._state = ClusterState()
        self._versions: dict[str, int] = {}
        # Rebuild the fold from the whole log before trusting it (at start).
        self._stale = True
        # One fold at a time in this process: an append and a catch-up must not both
        # evolve the same events into the shared state.
        self._state_lock = asyncio.Lock()

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def state(self) -> ClusterState:
        return self._state

    async def append(
        self, stream: str, expected_version: int | None, events: Sequence[NewEvent], meta: Meta
    ) -> list[Recorded]:
        return await self.append_many([AppendRequest(stream, expected_version, events)], meta)

    async def append_many(self, requests: Sequence[AppendRequest], meta: Meta) -> list[Recorded]:
        async with self._state_lock, connection(self._engine) as db:
            if self._stale:
                await self._catch_up_locked(db)
            try:
                # Optimistic: one round trip when our fold is current (the usual case for
                # the control plane, the only steady writer).
                return await self._attempt(db, requests, meta)
            except _Stale:
                pass  # another process appended meanwhile: take the lock, below
            # Another process appended meanwhile. Take the append lock for the whole
            # catch-up and append, so a busy log cannot starve this writer.
            async with db.transaction():
                await db.execute("SELECT pg_advisory_xact_lock($1)", APPEND_LOCK_KEY)
                await self._catch_up_locked(db)
                return await self._attempt(db, requests, meta)

    async def _attempt(
        self, db: asyncpg.Connection, requests: Sequence[AppendRequest], meta: Meta
    ) -> list[Recorded]:
        try:
            plan = self._plan(requests, meta)
        except ConcurrencyError:
            if await self._catch_up_locked(db) > 0:
                raise _Stale() from None  # another writer moved the stream: check again
            if await _any_stored(db, requests):
                return await self._append_rest(db, requests, meta)
            raise  # our fold is current and the events are new: a real conflict
        if not plan:
            return []
        try:
            return await self._call_append(db, plan, meta)
        except _AlreadyStored:
            return await self._append_rest(db, requests, meta)

    def _plan(self, requests: Sequence[AppendRequest], meta: Meta) -> list[Recorded]:
        """The events as they will be recorded (positions provisional), checking versions."""
        now = self._clock()
        versions: dict[str, int] = {}
        plan: list[Recorded] = []
        position = self._state.position
        for request in requests:
            actual = versions.get(request.stream, self._versions.get(request.stream, 0))
            expected = request.expected_version
            if expected is not None and expected != actual and request.events:
                raise ConcurrencyError(request.stream, expected, actual)
            for new in request.events:
                actual += 1
                position += 1
                plan.append(
                    Recorded(
                        position=position,
                        stream=request.stream,
                        version=actual,
                        event_id=new.event_id,
                        recorded_at=now,
                        meta=meta,
                        event=storable(new.event),
                    )
                )
            versions[request.stream] = actual
        return plan

    async def _call_append(
        self, db: asyncpg.Connection, plan: list[Recorded], meta: Meta
    ) -> list[Recorded]:
        changes, snapshot = fold(self._state, plan)
        try:
            rows = await db.fetch(
                _APPEND_CALL, *_arguments(plan, meta, changes, snapshot.position, self._channel)
            )
        except asyncpg.PostgresError as exc:
            snapshot.restore(self._state)
            raise _translate(exc, meta) from exc
        except BaseException:
            # The call may or may not have committed: undo the fold; if it did commit, the
            # next append finds the log ahead of us and catches up.
            snapshot.restore(self._state)
            raise
        positions = {row["out_event_id"]: row["out_position"] for row in rows}
        recorded = [replace(r, position=positions[r.event_id]) for r in plan]
        self._state.position = max(positions.values())
        for one in recorded:
            self._versions[one.stream] = one.version
        return recorded

    async def _append_rest(
        self, db: asyncpg.Connection, requests: Sequence[AppendRequest], meta: Meta
    ) -> list[Recorded]:
        """Some events were stored before (a retried request): return those as stored and
        append the others, if any."""
        await self._catch_up_locked(db)
        ids = [new.event_id for request in requests for new in request.events]
        rows = await db.fetch(_SELECT_EVENTS + " WHERE event_id = ANY($1::uuid[])", ids)
        known = {r.event_id: r for r in map(record_from_row, rows)}
        rest = [
            AppendRequest(
                r.stream, r.expected_version, [e for e in r.events if e.event_id not in known]
            )
            for r in requests
        ]
        stored = [known[i] for i in ids if i in known]
        if not any(r.events for r in rest):
            return stored
        plan = self._plan(rest, meta)
        return stored + await self._call_append(db, plan, meta)

    async def _catch_up_locked(self, db: asyncpg.Connection) -> int:
        """Fold what other writers appended since our state was last current."""
        if self._stale:
            self._state = ClusterState()
            self._versions = {}
        count = 0
        while True:
            rows = await db.fetch(
                _SELECT_EVENTS + " WHERE position > $1 ORDER BY position LIMIT 10000",
                self._state.position,
            )
            if not rows:
                break
            for recorded in map(record_from_row, rows):
                evolve(self._state, recorded)
                self._versions[recorded.stream] = recorded.version
            count += len(rows)
        self._stale = False
        return count

    async def catch_up(self) -> ClusterState:
        """Bring ``state`` up to the end of the log."""
        async with self._state_lock, connection(self._engine) as db:
            await self._catch_up_locked(db)
        return self._state

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]:
        async with connection(self._engine) as db:
            rows = await db.fetch(
                _SELECT_EVENTS + " WHERE stream = $1 AND version > $2 ORDER BY version",
                stream,
                after_version,
            )
        return [record_from_row(row) for row in rows]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]:
        async with connection(self._engine) as db:
            rows = await db.fetch(
                _SELECT_EVENTS + " WHERE position > $1 ORDER BY position LIMIT $2",
                after_position,
                limit,
            )
        return [record_from_row(row) for row in rows]

    async def read_correlated(self, correlation_id: str, limit: int = 1000) -> list[Recorded]:
        return await history.read_correlated(self._engine, correlation_id, limit)

    def known_version(self, stream: str) -> int:
        return self._versions.get(stream, 0)

    async def stream_version(self, stream: str) -> int:
        async with connection(self._engine) as db:
            version = await db.fetchval(
                "SELECT coalesce(max(version), 0) FROM events WHERE stream = $1", stream
            )
        return int(version)

    async def last_position(self) -> int:
        async with connection(self._engine) as db:
            position = await db.fetchval("SELECT coalesce(max(position), 0) FROM events")
        return int(position)


async def _any_stored(db: asyncpg.Connection, requests: Sequence[AppendRequest]) -> bool:
    ids = [new.event_id for request in requests for new in request.events]
    return bool(
        await db.fetchval("SELECT count(*) FROM events WHERE event_id = ANY($1::uuid[])", ids)
    )


class _Stale(Exception):
    """Another writer appended since our fold was current."""


class _AlreadyStored(Exception):
    """At least one event id is already in the log."""


def _translate(exc: asyncpg.PostgresError, meta: Meta) -> Exception:
    detail = getattr(exc, "detail", None) or ""
    match exc.sqlstate:
        case "LG001":
            return _Stale()
        case "LG004":
            return _AlreadyStored()
        case "LG003":
            return FencedError(meta.epoch or 0, int(detail or 0))
        case "LG002":
            stream, _, actual = detail.rpartition(" ")
            return ConcurrencyError(stream, None, int(actual or 0))
    return StoreError(f"append failed: {exc}")


def _arguments(
    plan: list[Recorded], meta: Meta, changes: RowChanges, last_position: int, channel: str
) -> tuple[Any, ...]:
    columns: list[list[Any]] = [[] for _ in range(9)]
    for recorded in plan:
        event = recorded.event
        type_name, schema_version, data = encode_event(event)
        values = (
            recorded.stream,
            recorded.version,
            type_name,
            schema_version,
            data.decode(),
            recorded.event_id,
            getattr(event, "replica_id", None),
            getattr(event, "node_id", None) or getattr(event, "claimed_node_id", None),
            getattr(event, "model", None),
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return (
        last_position,
        meta.epoch,
        *columns,
        encode_meta(meta).decode(),
        plan[0].recorded_at,
        meta.actor,
        meta.correlation_id,
        changes.touched["models"],
        changes.touched["nodes"],
        changes.touched["replicas"],
        changes.touched["api_keys"],
        _json(changes.rows),
        channel,
    )


def _json(value: Any) -> str:
    return _encoder.encode(value).decode()


async def write_all_rows(db: asyncpg.Connection, rows: dict[str, list[dict[str, Any]]]) -> None:
    """Insert every row of a fresh projection (used by rebuild, after TRUNCATE)."""
    for table in PROJECTION_TABLES:
        await db.execute(
            f"INSERT INTO {table.name} SELECT * FROM "
            f"jsonb_populate_recordset(NULL::{table.name}, $1::jsonb)",
            _json(rows[table.name]),
        )


def json_columns(table: Table) -> frozenset[str]:
    return frozenset(c.name for c in table.columns if isinstance(c.type, JSONB))
