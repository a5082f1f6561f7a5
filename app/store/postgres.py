"""The event store in PostgreSQL: a recorder around ``llmgw_append``, and the store built on it.

An append is one call of the ``llmgw_append`` function (migrations 0002, 0005, 0016 and
0017): it takes the append lock, checks that the caller's fold is current (the log ends at
the fold's position and with the fold's last event: after a failover to a standby that had
not received the last events, the log can reach that position again with other events),
that no event id is already stored, that every stream is at the version the caller
expects, that every projection row is of an entity the events are about (``LG006``) and,
for a caller that is not the owner, that the events' time is within a minute of the
database's clock (``LG005``, which reaches the caller as ``ClockOff``, saying how far off
this machine's clock is; ``LG006`` as a ``StoreError`` with the function's message),
inserts the events (chained), replaces the projection rows of every entity they touch,
moves the checkpoint and notifies listeners, all in one statement and so one transaction.
Why appends are serialized, and why this is one round trip, is explained there. The check
of the fold's last event reads nothing more than the position's did: the last row's id
comes with its position. ``PostgresRecorder`` is the only place where the
function's refusals (SQLSTATEs ``LG001``-``LG006``) become the store's errors; connection
errors are translated by ``app.store.database``, except one that breaks the connection
after the call was sent: PostgreSQL may have committed the append, so it is
``AppendOutcomeUnknown``, never a refusal (the driver's refusals to send on a connection
it knows is broken are ``StoreUnavailable``: nothing was recorded).

The version check runs first in the store, against the stream versions of the in-memory
fold, so a writer that loses a race is refused before anything reaches the database and
consumes no position: it leaves no hole. (A transaction that fails after inserting, a lost
connection say, does leave a gap in ``position``; readers never wait for gaps, they rely
only on positions becoming visible in commit order, so a gap cannot stall them.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import utc_now
from app.clock_offset import APPEND_CLOCK_SLACK_S
from app.domain.envelope import Meta, Recorded
from app.domain.events import subjects
from app.domain.replica_listing import WHOLE_LIST, ReplicaPage
from app.domain.state import Replica, ReplicaFilter
from app.store import history, replica_rows
from app.store.codec import RECORDED_COLUMNS, encode_event, encode_meta, record_from_row
from app.store.database import broke_connection, connection
from app.store.errors import (
    AlreadyRecorded,
    AppendOutcomeUnknown,
    ClockOff,
    ConcurrencyError,
    FencedError,
    LogMovedOn,
    StoreError,
    StoreUnavailable,
)
from app.store.folded import FoldedEventStore, SnapshotPolicy
from app.store.projection import RowChanges
from app.store.snapshot_table import PostgresFoldSnapshots

APPEND_LOCK_KEY = 0x6C6C6D67_77000001  # "llmgw" + 1: one key for the whole log
NOTIFY_CHANNEL = "llmgw_events"
REBUILT = "rebuilt"
"""What a projection rebuild notifies the log's channel with (an append notifies its last
position): rows may have changed without an event, so a reader that follows the events to
know what changed reads everything again."""
CHECKPOINT = "main"

_SELECT_EVENTS = f"SELECT {RECORDED_COLUMNS} FROM events"

_APPEND_CALL = (
    "SELECT out_position, out_event_id FROM llmgw_append($1, $2::uuid, $3, $4::text[], "
    "$5::int[], $6::text[], $7::smallint[], $8::jsonb[], $9::uuid[], $10::text[], "
    "$11::text[], $12::text[], $13::jsonb, $14, $15, $16, $17::text[], $18::text[], "
    "$19::text[], $20::text[], $21::jsonb, $22)"
)
_encoder = msgspec.json.Encoder()
DEFAULT_POLICY = SnapshotPolicy()


class PostgresEventStore(FoldedEventStore):
    """The store of ``llmgw-server``: the log in PostgreSQL, the fold in this process, fold
    snapshots in ``fold_snapshots`` (``policy=None`` writes none; start-up still reads
    them)."""

    def __init__(
        self,
        engine: AsyncEngine,
        clock: Callable[[], datetime] = utc_now,
        notify_channel: str = NOTIFY_CHANNEL,
        *,
        policy: SnapshotPolicy | None = DEFAULT_POLICY,
    ) -> None:
        super().__init__(
            PostgresRecorder(engine, notify_channel),
            clock=clock,
            snapshots=PostgresFoldSnapshots(engine),
            policy=policy,
        )
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        return self._engine


class PostgresRecorder:
    def __init__(self, engine: AsyncEngine, notify_channel: str = NOTIFY_CHANNEL) -> None:
        self._engine = engine
        self._channel = notify_channel

    @asynccontextmanager
    async def session(self) -> AsyncIterator[PostgresSession]:
        async with connection(self._engine) as db:
            yield PostgresSession(db, self._channel)

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
            return await _events_after(db, after_position, limit)

    async def read_correlated(
        self, correlation_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Recorded]:
        return await history.read_correlated(self._engine, correlation_id, limit, newest=newest)

    async def read_about_replica(self, replica_id: str) -> list[Recorded]:
        return await replica_rows.read_about_replica(self._engine, replica_id)

    async def forgotten_replicas(
        self, known: Collection[str], among: ReplicaFilter, page: ReplicaPage = WHOLE_LIST
    ) -> list[Replica]:
        return await replica_rows.read_forgotten_replicas(self._engine, known, among, page)

    async def any_ended_replica(self, among: ReplicaFilter) -> bool:
        return await replica_rows.any_ended_replica(self._engine, among)

    async def ended_replicas_by_model(self, before: datetime) -> dict[str, int]:
        return await replica_rows.count_ended(self._engine, before)

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


class PostgresSession:
    def __init__(self, db: asyncpg.Connection, channel: str) -> None:
        self._db = db
        self._channel = channel
        self._uncommitted: Meta | None = None
        """The meta of an append recorded in the ``exclusive`` transaction under way."""

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """A transaction holding the append lock (the one ``llmgw_append`` takes). A
        connection that breaks once ``COMMIT`` of an append is sent leaves it
        ``AppendOutcomeUnknown``; before, the transaction is rolled back, and ``record``
        says nothing was recorded."""
        self._uncommitted = None
        try:
            async with self._db.transaction():
                await self._db.execute("SELECT pg_advisory_xact_lock($1)", APPEND_LOCK_KEY)
                yield
        except Exception as exc:
            meta = self._take_uncommitted()
            if meta is not None and broke_connection(exc):
                raise AppendOutcomeUnknown(meta.correlation_id, str(exc) or repr(exc)) from exc
            raise
        self._uncommitted = None

    def _take_uncommitted(self) -> Meta | None:
        """The meta ``record`` left for the transaction under way (and forget it)."""
        meta, self._uncommitted = self._uncommitted, None
        return meta

    async def events_after(self, position: int, limit: int) -> list[Recorded]:
        return await _events_after(self._db, position, limit)

    async def events_with_ids(self, event_ids: Sequence[UUID]) -> list[Recorded]:
        rows = await self._db.fetch(
            _SELECT_EVENTS + " WHERE event_id = ANY($1::uuid[])", list(event_ids)
        )
        return [record_from_row(row) for row in rows]

    async def stream_versions(self, streams: Sequence[str]) -> dict[str, int]:
        rows = await self._db.fetch(
            "SELECT stream, max(version) FROM events WHERE stream = ANY($1::text[]) "
            "GROUP BY stream",
            list(streams),
        )
        return {row[0]: int(row[1]) for row in rows}

    async def record(
        self,
        batch: Sequence[Recorded],
        rows: RowChanges,
        meta: Meta,
        after_position: int,
        after_event_id: UUID | None,
    ) -> dict[UUID, int]:
        arguments = _arguments(batch, meta, rows, after_position, after_event_id, self._channel)
        try:
            result = await self._db.fetch(_APPEND_CALL, *arguments)
        except (asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
            # The driver's own refusals, before it sends anything: a connection it knows is
            # closed, or left unusable by the server's goodbye while it sat in the pool.
            raise change_not_sent(exc) from exc
        except Exception as exc:
            if broke_connection(exc) and self._db.is_in_transaction():
                # In ``exclusive``: PostgreSQL rolls back a transaction whose client is gone.
                raise StoreUnavailable(
                    f"database connection lost before the change was committed ({exc}); "
                    "nothing was recorded"
                ) from exc
            # A connection that broke once the call was sent (reset, cut off past the
            # timeout, ended by an administrator or a restart) may have committed it first.
            if broke_connection(exc):
                raise AppendOutcomeUnknown(meta.correlation_id, str(exc) or repr(exc)) from exc
            if isinstance(exc, asyncpg.PostgresError):
                raise _translate(exc, meta, batch[0].recorded_at) from exc
            raise
        if self._db.is_in_transaction():
            self._uncommitted = meta
        return {row["out_event_id"]: row["out_position"] for row in result}


def change_not_sent(
    refusal: asyncpg.InterfaceError | asyncpg.InternalClientError,
) -> StoreUnavailable:
    """The driver's refusal to send an append as the operator reads it. Its internal error
    (``cannot switch to state 11; another operation (2) is in progress``) means the server
    had ended the connection while it sat in the pool: said in plain words, as
    ``app.store.database`` says it. Its interface error (``connection is closed``) is
    already plain."""
    if isinstance(refusal, asyncpg.InternalClientError):
        return StoreUnavailable(
            "the connection to the database had been ended before the change was sent (its "
            "session was ended by an administrator or a timeout, or the database restarted "
            "or failed over); nothing was recorded"
        )
    return StoreUnavailable(
        f"database connection lost before the change was sent ({refusal}); nothing was recorded"
    )


async def _events_after(db: asyncpg.Connection, position: int, limit: int) -> list[Recorded]:
    rows = await db.fetch(
        _SELECT_EVENTS + " WHERE position > $1 ORDER BY position LIMIT $2", position, limit
    )
    return [record_from_row(row) for row in rows]


def _translate(exc: asyncpg.PostgresError, meta: Meta, recorded_at: datetime) -> StoreError:
    detail = getattr(exc, "detail", None) or ""
    match exc.sqlstate:
        case "LG005":
            return ClockOff(_clock_offset_s(str(exc), recorded_at), APPEND_CLOCK_SLACK_S)
        case "LG001":
            return LogMovedOn(str(exc))
        case "LG004":
            return AlreadyRecorded(str(exc))
        case "LG003":
            return FencedError(meta.epoch or 0, int(detail or 0))
        case "LG002":
            stream, _, actual = detail.rpartition(" ")
            return ConcurrencyError(stream, None, int(actual or 0))
    return StoreError(f"append failed: {exc}")


def _clock_offset_s(refusal: str, recorded_at: datetime) -> float | None:
    """How far the events' time is ahead of the database's clock, which ``LG005``'s message
    ends with (``..., 2026-12-06 07:10:00.12+00``); None where it cannot be read."""
    _, _, database_time = refusal.rpartition(", ")
    try:
        database_now = datetime.fromisoformat(database_time.strip())
    except ValueError:
        return None
    if database_now.tzinfo is None:
        return None
    return (recorded_at - database_now).total_seconds()


def _arguments(
    batch: Sequence[Recorded],
    meta: Meta,
    changes: RowChanges,
    last_position: int,
    last_event_id: UUID | None,
    channel: str,
) -> tuple[Any, ...]:
    columns: list[list[Any]] = [[] for _ in range(9)]
    for recorded in batch:
        event = recorded.event
        type_name, schema_version, data = encode_event(event)
        about = subjects(event)
        values = (
            recorded.stream,
            recorded.version,
            type_name,
            schema_version,
            data.decode(),
            recorded.event_id,
            about.replica,
            about.node,
            about.model,
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return (
        last_position,
        last_event_id,
        meta.epoch,
        *columns,
        encode_meta(meta).decode(),
        batch[0].recorded_at,
        meta.actor,
        meta.correlation_id,
        changes.touched["models"],
        changes.touched["nodes"],
        changes.touched["replicas"],
        changes.touched["api_keys"],
        _encoder.encode(changes.rows).decode(),
        channel,
    )
