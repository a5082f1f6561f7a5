"""Fold snapshots in PostgreSQL: ``fold_snapshots`` (one row a snapshot) and
``fold_snapshot_chunks`` (its bytes), migration 0006.

A snapshot is bound to the log it was taken of: its row keeps the chain hash of the event
at its position, and one whose position no longer holds that event (a log restored from an
older backup, say) is passed over. The id of that event is read with its chain hash and
comes with the state: the fold's appends name the event it ends with, which ``llmgw_append``
checks (migration 0016). Its row also keeps the sha256 of its chunks, so damage
is found before anything is decoded into the state. Whatever is wrong with the newest, the
reader tries the next, and with none left the store replays the whole log: a warning each
time, never a wrong state. ``projections rebuild --verify`` also compares every snapshot
with a replay of the log up to its position.

The chunks are written first and the row last, in one transaction, so a snapshot is
visible whole or not at all; older ones beyond ``KEEP`` go in the same transaction. One
writer at a time (an advisory lock, tried, never waited for): a second would only write
the same snapshot again.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import NamedTuple

import asyncpg
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.state import ClusterState
from app.store import snapshot_format
from app.store.collector import paused_gc
from app.store.database import connection
from app.store.errors import StoreError, UnreadableSnapshot
from app.store.recorder import LoadedSnapshot

log = structlog.get_logger(__name__)

SNAPSHOT_LOCK_KEY = 0x6C6C6D67_77000003  # "llmgw" + 3 (+ 1 is the append lock, + 2 the leader's)
KEEP = 2
"""Snapshots kept: the newest and one before it, in case the newest is found damaged."""


class SnapshotRow(NamedTuple):
    position: int
    chain_hash: bytes
    fingerprint: str
    chunks: int
    size: int
    digest: bytes


SELECT_SNAPSHOTS = (
    "SELECT position, chain_hash, fingerprint, chunks, bytes, digest FROM fold_snapshots "
    "ORDER BY position DESC"
)


class PostgresFoldSnapshots:
    def __init__(self, engine: AsyncEngine, *, keep: int = KEEP) -> None:
        self._engine = engine
        self._keep = keep

    async def load(self) -> LoadedSnapshot | None:
        try:
            return await self._load()
        except asyncpg.UndefinedTableError:
            log.warning(
                "fold_snapshots_missing",
                detail="no fold_snapshots table (migrate the database): replaying the whole log",
            )
            return None
        except asyncpg.PostgresError as exc:
            raise StoreError(f"reading the fold snapshots failed: {exc}") from exc

    async def _load(self) -> LoadedSnapshot | None:
        async with connection(self._engine) as db, db.transaction(isolation="repeatable_read"):
            found = [SnapshotRow(*row) for row in await db.fetch(SELECT_SNAPSHOTS)]
            for snapshot in found:
                try:
                    return await read_snapshot(db, snapshot)
                except UnreadableSnapshot as exc:
                    log.warning(
                        "fold_snapshot_passed_over", position=snapshot.position, reason=exc.detail
                    )
        if found:
            log.warning(
                "fold_snapshots_unusable",
                detail="no usable fold snapshot: replaying the whole log",
                snapshots=[snapshot.position for snapshot in found],
            )
        return None

    async def save(self, state: ClusterState, versions: dict[str, int]) -> bool:
        try:
            return await self._save(state, versions)
        except asyncpg.PostgresError as exc:
            raise StoreError(f"writing a fold snapshot failed: {exc}") from exc

    async def _save(self, state: ClusterState, versions: dict[str, int]) -> bool:
        position = state.position
        async with connection(self._engine) as db, db.transaction():
            if not await db.fetchval("SELECT pg_try_advisory_xact_lock($1)", SNAPSHOT_LOCK_KEY):
                return False  # another server is writing one right now
            chain_hash = await db.fetchval(
                "SELECT chain_hash FROM events WHERE position = $1", position
            )
            if chain_hash is None:
                raise StoreError(f"no event at position {position} to take a snapshot at")
            if await db.fetchval("SELECT 1 FROM fold_snapshots WHERE position = $1", position):
                return False
            digest, count, size = hashlib.sha256(), 0, 0
            for chunk in snapshot_format.encode(state, versions):
                # Each await lets the event loop run between chunks of a few milliseconds.
                await db.execute(
                    "INSERT INTO fold_snapshot_chunks (position, chunk, data) VALUES ($1, $2, $3)",
                    position,
                    count,
                    chunk,
                )
                digest.update(chunk)
                count += 1
                size += len(chunk)
            await db.execute(
                "INSERT INTO fold_snapshots (position, chain_hash, fingerprint, chunks, bytes, "
                "digest) VALUES ($1, $2, $3, $4, $5, $6)",
                position,
                chain_hash,
                snapshot_format.fingerprint(),
                count,
                size,
                digest.digest(),
            )
            await _prune(db, self._keep)
        return True

    async def stored(self) -> list[SnapshotRow]:
        """Every snapshot kept, newest first."""
        async with connection(self._engine) as db:
            return [SnapshotRow(*row) for row in await db.fetch(SELECT_SNAPSHOTS)]


async def read_snapshot(db: asyncpg.Connection, snapshot: SnapshotRow) -> LoadedSnapshot:
    """The state and versions of ``snapshot``, checked, and the id of the event at its
    position; raises ``UnreadableSnapshot``. Must run inside a transaction (the cursor
    needs one)."""
    position = snapshot.position
    if snapshot.fingerprint != snapshot_format.fingerprint():
        raise UnreadableSnapshot(position, "it was written by another version of the fold")
    event = await db.fetchrow(
        "SELECT chain_hash, event_id FROM events WHERE position = $1", position
    )
    if event is None:
        raise UnreadableSnapshot(position, "the log has no event at its position")
    chain_hash, head = event
    if bytes(chain_hash) != bytes(snapshot.chain_hash):
        raise UnreadableSnapshot(position, "the log's event at its position is another one")
    digest, count = hashlib.sha256(), 0
    decoding = snapshot_format.Decoding(position)
    undecodable: UnreadableSnapshot | None = None
    with paused_gc():
        async for data in _chunks(db, position):
            digest.update(data)
            count += 1
            if undecodable is None:
                try:
                    decoding.add(data)
                except UnreadableSnapshot as exc:
                    undecodable = exc  # damage, unless the bytes are the ones written
    if count != snapshot.chunks or digest.digest() != bytes(snapshot.digest):
        raise UnreadableSnapshot(position, "its chunks are damaged or missing")
    if undecodable is not None:
        raise undecodable
    state, versions = decoding.result()
    return LoadedSnapshot(state, versions, head)


async def _chunks(db: asyncpg.Connection, position: int) -> AsyncIterator[bytes]:
    query = "SELECT data FROM fold_snapshot_chunks WHERE position = $1 ORDER BY chunk"
    async for row in db.cursor(query, position, prefetch=8):
        yield bytes(row[0])


async def _prune(db: asyncpg.Connection, keep: int) -> None:
    await db.execute(
        "DELETE FROM fold_snapshots WHERE position NOT IN "
        "(SELECT position FROM fold_snapshots ORDER BY position DESC LIMIT $1)",
        keep,
    )
    await db.execute(
        "DELETE FROM fold_snapshot_chunks c WHERE NOT EXISTS "
        "(SELECT 1 FROM fold_snapshots s WHERE s.position = c.position)"
    )
