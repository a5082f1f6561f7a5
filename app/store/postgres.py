"""The event store in PostgreSQL: events, projection rows and checkpoint in one transaction.

Why appends are serialized: ``position`` comes from an identity sequence, and sequence
values are handed out when a row is inserted, not when its transaction commits. Two
concurrent appenders could commit positions 8 and 7 in that order; a reader that has
already seen 8 and continues from ``position > 8`` would never see 7. Every append
therefore takes one transaction-scoped advisory lock before it reads versions or inserts,
so positions become visible strictly in commit order and a tailer can never skip an event.

The version check and the idempotency check run under that lock *before* anything is
inserted, so a writer that loses the check consumes no position: it leaves no hole.
(A transaction that fails after inserting, say a lost connection, does leave a gap;
readers never wait for gaps, they only rely on commit order, so a gap cannot stall them.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec
from sqlalchemy import Table, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta, Recorded
from app.domain.evolve import evolve
from app.domain.state import ClusterState
from app.store.codec import decode_event, decode_meta, encode_event, encode_meta
from app.store.database import driver_connection, translated_errors
from app.store.errors import ConcurrencyError, FencedError
from app.store.interface import AppendRequest, NewEvent
from app.store.projection import RowChanges, fold
from app.store.tables import PROJECTION_TABLES, api_keys, models, nodes, replicas, shards

APPEND_LOCK_KEY = 0x6C6C6D67_77000001  # "llmgw" + 1: one key for the whole log
NOTIFY_CHANNEL = "llmgw_events"
CHECKPOINT = "main"
_LOCK = text("SELECT pg_advisory_xact_lock(:key)")

_SELECT_EVENTS = (
    "SELECT position, stream, version, event_id, recorded_at, meta::text AS meta, type, "
    "schema_version, data::text AS data FROM events"
)

_INSERT_EVENTS = """
INSERT INTO events (stream, version, type, schema_version, data, meta, event_id,
                    recorded_at, replica_id, node_id, model, actor, correlation_id)
SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::smallint[], $5::jsonb[],
                     $6::jsonb[], $7::uuid[], $8::timestamptz[], $9::text[], $10::text[],
                     $11::text[], $12::text[], $13::text[])
RETURNING position, event_id
"""


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
        # The state must be rebuilt from the log before it is trusted: at start, and after
        # a transaction failed once the fold had already changed it.
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
        folded = False
        try:
            async with self._state_lock, translated_errors(), self._engine.begin() as conn:
                # Through SQLAlchemy, so its transaction has begun before the driver is used.
                await conn.execute(_LOCK, {"key": APPEND_LOCK_KEY})
                db = await driver_connection(conn)
                if meta.epoch is not None:
                    await _check_epoch(db, meta.epoch)
                existing, fresh = await _split_known(db, requests)
                if not any(events for _, _, events in fresh):
                    return existing
                versions = await _check_versions(db, fresh)
                await self._catch_up_locked(db)
                recorded = await self._insert(db, fresh, versions, meta)
                folded = True
                changes = fold(self._state, recorded)
                await _write_changes(db, changes)
                await db.execute(
                    "UPDATE projection_checkpoints SET position = $1 WHERE name = $2",
                    self._state.position,
                    CHECKPOINT,
                )
                last = str(recorded[-1].position)
                await db.execute("SELECT pg_notify($1, $2)", self._channel, last)
            return existing + recorded
        except BaseException:
            if folded:
                self._stale = True
            raise

    async def _insert(
        self,
        db: asyncpg.Connection,
        fresh: list[tuple[str, int | None, list[NewEvent]]],
        versions: dict[str, int],
        meta: Meta,
    ) -> list[Recorded]:
        now = self._clock()
        meta_json = encode_meta(meta).decode()
        columns: list[list[Any]] = [[] for _ in range(13)]
        pending: list[tuple[str, int, NewEvent]] = []
        for stream, _, events in fresh:
            version = versions.get(stream, 0)
            for new in events:
                version += 1
                type_name, schema_version, data = encode_event(new.event)
                event = new.event
                row = (
                    stream,
                    version,
                    type_name,
                    schema_version,
                    data.decode(),
                    meta_json,
                    new.event_id,
                    now,
                    getattr(event, "replica_id", None),
                    getattr(event, "node_id", None) or getattr(event, "claimed_node_id", None),
                    getattr(event, "model", None),
                    meta.actor,
                    meta.correlation_id,
                )
                for column, value in zip(columns, row, strict=True):
                    column.append(value)
                pending.append((stream, version, new))
        returned = await db.fetch(_INSERT_EVENTS, *columns)
        positions = {row["event_id"]: row["position"] for row in returned}
        return [
            Recorded(
                position=positions[new.event_id],
                stream=stream,
                version=version,
                event_id=new.event_id,
                recorded_at=now,
                meta=meta,
                event=new.event,
            )
            for stream, version, new in pending
        ]

    async def _catch_up_locked(self, db: asyncpg.Connection) -> None:
        """Fold what other writers appended since our state was last current."""
        if self._stale:
            self._state = ClusterState()
        while True:
            rows = await db.fetch(
                _SELECT_EVENTS + " WHERE position > $1 ORDER BY position LIMIT 10000",
                self._state.position,
            )
            if not rows:
                break
            for recorded in map(record_from_row, rows):
                evolve(self._state, recorded)
        self._stale = False

    async def catch_up(self) -> ClusterState:
        """Bring ``state`` up to the end of the log (reads only; takes no lock)."""
        async with self._state_lock, translated_errors(), self._engine.connect() as conn:
            db = await driver_connection(conn)
            await self._catch_up_locked(db)
        return self._state

    async def read_stream(self, stream: str, after_version: int = 0) -> list[Recorded]:
        async with translated_errors(), self._engine.connect() as conn:
            db = await driver_connection(conn)
            rows = await db.fetch(
                _SELECT_EVENTS + " WHERE stream = $1 AND version > $2 ORDER BY version",
                stream,
                after_version,
            )
        return [record_from_row(row) for row in rows]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[Recorded]:
        async with translated_errors(), self._engine.connect() as conn:
            db = await driver_connection(conn)
            rows = await db.fetch(
                _SELECT_EVENTS + " WHERE position > $1 ORDER BY position LIMIT $2",
                after_position,
                limit,
            )
        return [record_from_row(row) for row in rows]

    async def stream_version(self, stream: str) -> int:
        async with translated_errors(), self._engine.connect() as conn:
            db = await driver_connection(conn)
            version = await db.fetchval(
                "SELECT coalesce(max(version), 0) FROM events WHERE stream = $1", stream
            )
        return int(version)

    async def last_position(self) -> int:
        async with translated_errors(), self._engine.connect() as conn:
            db = await driver_connection(conn)
            position = await db.fetchval("SELECT coalesce(max(position), 0) FROM events")
        return int(position)


def record_from_row(row: asyncpg.Record) -> Recorded:
    position: int = row["position"]
    return Recorded(
        position=position,
        stream=row["stream"],
        version=row["version"],
        event_id=row["event_id"],
        recorded_at=row["recorded_at"],
        meta=decode_meta(row["meta"]),
        event=decode_event(position, row["type"], row["schema_version"], row["data"]),
    )


async def _check_epoch(db: asyncpg.Connection, epoch: int) -> None:
    current = await db.fetchval("SELECT epoch FROM leadership WHERE id = 1")
    if current is not None and current > epoch:
        raise FencedError(epoch, int(current))


async def _split_known(
    db: asyncpg.Connection, requests: Sequence[AppendRequest]
) -> tuple[list[Recorded], list[tuple[str, int | None, list[NewEvent]]]]:
    """Events already in the log (by ``event_id``) and, per stream, those that are not."""
    ids = [new.event_id for request in requests for new in request.events]
    rows = await db.fetch(_SELECT_EVENTS + " WHERE event_id = ANY($1::uuid[])", ids) if ids else []
    known = {row["event_id"]: record_from_row(row) for row in rows}
    fresh = [
        (r.stream, r.expected_version, [e for e in r.events if e.event_id not in known])
        for r in requests
    ]
    return [known[i] for i in ids if i in known], fresh


async def _check_versions(
    db: asyncpg.Connection, fresh: list[tuple[str, int | None, list[NewEvent]]]
) -> dict[str, int]:
    streams = sorted({stream for stream, _, events in fresh if events})
    rows = await db.fetch(
        "SELECT stream, max(version) AS version FROM events WHERE stream = ANY($1::text[]) "
        "GROUP BY stream",
        streams,
    )
    versions = {row["stream"]: int(row["version"]) for row in rows}
    for stream, expected, events in fresh:
        if events and expected is not None and versions.get(stream, 0) != expected:
            raise ConcurrencyError(stream, expected, versions.get(stream, 0))
    return versions


# -- writing projection rows -------------------------------------------------------------


class _TableWriter(msgspec.Struct, frozen=True):
    name: str
    key: str
    columns: tuple[str, ...]
    json_columns: frozenset[str]
    upsert_sql: str
    delete_sql: str

    def encode(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(
            msgspec.json.encode(row[c]).decode() if c in self.json_columns else row[c]
            for c in self.columns
        )


def _writer(table: Table) -> _TableWriter:
    columns = tuple(c.name for c in table.columns)
    keys = [c.name for c in table.primary_key.columns]
    values = ", ".join(
        f"${i}::jsonb" if isinstance(table.c[c].type, JSONB) else f"${i}"
        for i, c in enumerate(columns, 1)
    )
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in keys)
    return _TableWriter(
        name=table.name,
        key=keys[0],
        columns=columns,
        json_columns=frozenset(c.name for c in table.columns if isinstance(c.type, JSONB)),
        upsert_sql=(
            f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({values}) "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
        ),
        delete_sql=f"DELETE FROM {table.name} WHERE {keys[0]} = ANY($1::text[])",
    )


WRITERS = {table.name: _writer(table) for table in PROJECTION_TABLES}
_ENTITY_TABLES = (models, nodes, replicas, api_keys)


async def _write_changes(db: asyncpg.Connection, changes: RowChanges) -> None:
    for table in _ENTITY_TABLES:
        writer = WRITERS[table.name]
        deletes = changes.deletes.get(table.name)
        if deletes:
            await db.execute(writer.delete_sql, deletes)
        upserts = changes.upserts.get(table.name)
        if upserts:
            await db.executemany(writer.upsert_sql, [writer.encode(row) for row in upserts])
    if changes.shard_owners:
        shard_writer = WRITERS[shards.name]
        await db.execute(
            "DELETE FROM shards WHERE replica_id = ANY($1::text[])", changes.shard_owners
        )
        rows = changes.upserts.get(shards.name)
        if rows:
            await db.executemany(shard_writer.upsert_sql, [shard_writer.encode(r) for r in rows])


async def write_all_rows(db: asyncpg.Connection, rows: dict[str, list[dict[str, Any]]]) -> None:
    """Insert every row of a fresh projection (used by rebuild, after TRUNCATE)."""
    for table in PROJECTION_TABLES:
        writer = WRITERS[table.name]
        encoded = [writer.encode(row) for row in rows[table.name]]
        if encoded:
            await db.executemany(writer.upsert_sql, encoded)
