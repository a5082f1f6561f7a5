"""Replaying the log from its first event: what ``projections rebuild`` starts from, and the
check that every fold snapshot kept is what a replay gives at its position."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Recorded
from app.domain.evolve import evolve
from app.domain.state import ClusterState
from app.store import snapshot_format
from app.store.codec import RECORDED_COLUMNS, decode_recorded
from app.store.collector import paused_gc
from app.store.database import driver_connection, translated_errors
from app.store.errors import UnreadableSnapshot
from app.store.fold_view import absorb
from app.store.snapshot_table import SELECT_SNAPSHOTS, SnapshotRow, read_snapshot

_END = 2**63 - 1
_PAGE = 5000
_REPLAY = (
    f"SELECT {RECORDED_COLUMNS} FROM events WHERE position > $1 AND position <= $2 "
    "ORDER BY position"
)


class SnapshotDifference(msgspec.Struct, frozen=True):
    position: int
    """The snapshot's."""
    part: str
    """``nodes``, ``models``, ``replicas``, ``keys``, ``revocations``, ``versions``, or
    ``snapshot`` for one that cannot be read at all."""
    key: str
    problem: str
    """``missing`` (the replay has it, the snapshot not), ``unexpected``, ``differs`` (with
    the fields, as the snapshot has them and as the replay does) or ``unreadable``."""
    fields: dict[str, tuple[Any, Any]] = {}


async def replay_into(
    db: asyncpg.Connection,
    state: ClusterState,
    *,
    until: int = _END,
    versions: dict[str, int] | None = None,
) -> int:
    """Fold every event after ``state.position`` (up to ``until``) into ``state``, and each
    stream's version into ``versions`` if given; returns how many.

    Must run inside a transaction (the cursor needs one)."""
    count = 0
    batch: list[Recorded] = []
    with paused_gc():
        async for row in db.cursor(_REPLAY, state.position, until, prefetch=_PAGE):
            recorded = decode_recorded(row[0], row[1], row[2], row[3])
            count += 1
            if versions is None:
                evolve(state, recorded)
                continue
            batch.append(recorded)
            if len(batch) == _PAGE:
                absorb(state, versions, batch)
                batch = []
        if batch and versions is not None:
            absorb(state, versions, batch)
    return count


async def replay(engine: AsyncEngine) -> ClusterState:
    state = ClusterState()
    async with translated_errors(), engine.connect() as conn:
        await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
        await replay_into(await driver_connection(conn), state)
    return state


async def replay_checking_snapshots(
    db: asyncpg.Connection, state: ClusterState
) -> tuple[int, list[SnapshotDifference]]:
    """Replay the whole log into ``state``, stopping at every fold snapshot this fold can
    read to compare it with the replay; returns the events replayed and the differences.
    Snapshots of another fold's are not read at start-up, so they are not checked."""
    rows = [SnapshotRow(*row) for row in await db.fetch(SELECT_SNAPSHOTS)]
    versions: dict[str, int] = {}
    count = 0
    differences: list[SnapshotDifference] = []
    for snapshot in sorted(rows, key=lambda row: row.position):
        if snapshot.fingerprint != snapshot_format.fingerprint():
            continue
        count += await replay_into(db, state, until=snapshot.position, versions=versions)
        try:
            stored, stored_versions, _ = await read_snapshot(db, snapshot)
        except UnreadableSnapshot as exc:
            differences.append(
                SnapshotDifference(snapshot.position, "snapshot", "", "unreadable",
                                   {"reason": (exc.detail, None)})
            )  # fmt: skip
            continue
        differences += compare_folds(snapshot.position, stored, stored_versions, state, versions)
    count += await replay_into(db, state, versions=versions)
    return count, differences


def compare_folds(
    position: int,
    stored: ClusterState,
    stored_versions: dict[str, int],
    replayed: ClusterState,
    replayed_versions: dict[str, int],
) -> list[SnapshotDifference]:
    """What differs between a snapshot's fold and the replay's at the same position."""
    parts: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("nodes", stored.nodes, replayed.nodes),
        ("models", stored.models, replayed.models),
        ("replicas", stored.replicas, replayed.replicas),
        ("keys", stored.keys, replayed.keys),
        ("revocations", stored.revocations, replayed.revocations),
        ("versions", stored_versions, replayed_versions),
    ]
    differences = []
    for part, ours, theirs in parts:
        for key in sorted(theirs.keys() - ours.keys()):
            differences.append(SnapshotDifference(position, part, key, "missing"))
        for key in sorted(ours.keys() - theirs.keys()):
            differences.append(SnapshotDifference(position, part, key, "unexpected"))
        for key in sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k]):
            fields = _fields(ours[key], theirs[key])
            differences.append(SnapshotDifference(position, part, key, "differs", fields))
    return differences


def _fields(ours: Any, theirs: Any) -> dict[str, tuple[Any, Any]]:
    if not isinstance(ours, msgspec.Struct):
        return {"value": (ours, theirs)}
    mine, replayed = msgspec.to_builtins(ours), msgspec.to_builtins(theirs)
    return {
        name: (mine.get(name), replayed.get(name))
        for name in sorted(mine.keys() | replayed.keys())
        if mine.get(name) != replayed.get(name)
    }
