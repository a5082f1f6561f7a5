"""``projections rebuild [--verify]``: the projection tables from a replay of the whole log.

``--verify`` also compares every fold snapshot kept (``fold_snapshots``) with the replay at
its position: a snapshot is derived from the log like the tables are, and a start-up
trusts it.

A JSON column written from a domain type (``TYPED_JSON``) is compared as this release reads
it: a row an older release projected lacks the fields added since, and reads with their
defaults, as the log's old events do; that is no difference.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg
import msgspec
from sqlalchemy import Table, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncTransaction

from app.domain.model_spec import ModelSpec
from app.domain.state import ClusterState
from app.store.database import (
    answer_error,
    driver_connection,
    dropped_when_broken,
    store_error,
    translated_errors,
)
from app.store.errors import CommitOutcomeUnknown, StoreUnavailable
from app.store.postgres import APPEND_LOCK_KEY, CHECKPOINT, NOTIFY_CHANNEL, REBUILT
from app.store.projection import GpuRow, Row, all_rows
from app.store.replay import SnapshotDifference, replay_checking_snapshots, replay_into
from app.store.tables import PROJECTION_TABLES

TYPED_JSON: dict[tuple[str, str], Any] = {
    ("models", "spec"): ModelSpec,
    ("nodes", "gpus"): tuple[GpuRow, ...],
}
"""``(table, column) -> type`` of the JSON columns a domain type is written to. Compared
byte for byte, every model an older release declared differed after an upgrade (its spec
lacked ``rollout.min_latency_samples``), and ``--verify`` exited 1 on a sound database."""


class RowDifference(msgspec.Struct, frozen=True):
    table: str
    key: str
    problem: str
    """``missing`` (the log implies the row, the table lacks it), ``unexpected`` (the
    table has a row the log does not imply) or ``differs`` (with the columns). For table
    ``fold_snapshots`` the key is ``<position>/<part>/<id>`` and the problem can also be
    ``unreadable`` (damaged, or not of this log)."""
    columns: dict[str, tuple[Any, Any]] = {}


class RebuildReport(msgspec.Struct, frozen=True):
    events: int
    position: int
    rows: dict[str, int]
    differences: list[RowDifference]
    rewritten: bool


async def rebuild(engine: AsyncEngine, *, verify: bool) -> RebuildReport:
    """Replay the log into fresh rows. With ``verify``, compare them with the live tables and
    write nothing; without, replace the live tables with them (atomically). What
    PostgreSQL answers the statements sent straight through the driver (no privilege to
    write the tables, as the runtime role) becomes a ``StoreError`` too; a connection that
    breaks once the rewrite's ``COMMIT`` was sent, ``CommitOutcomeUnknown``."""
    try:
        return await _rebuild(engine, verify=verify)
    except asyncpg.PostgresError as exc:
        raise answer_error(exc) from exc


async def _rebuild(engine: AsyncEngine, *, verify: bool) -> RebuildReport:
    async with translated_errors(), engine.connect() as conn, dropped_when_broken(conn):
        # Left uncommitted when anything below raises: the connection's end rolls it back.
        transaction = await conn.begin()
        if verify:
            # One snapshot for the log and the tables, so appends during the check cannot
            # show up as differences; no lock, so the cluster keeps running.
            await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
        else:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": APPEND_LOCK_KEY})
        db = await driver_connection(conn)
        state = ClusterState()
        state.forgotten = []  # their rows stay in the tables: expected like any other
        if verify:
            count, snapshots = await replay_checking_snapshots(db, state)
        else:
            count = await replay_into(db, state)
        expected = all_rows(state)
        if verify:
            differences = await _compare(db, expected) + [_row(d) for d in snapshots]
        else:
            differences = []
            await db.execute(f"TRUNCATE {', '.join(t.name for t in PROJECTION_TABLES)}")
            await write_all_rows(db, expected)
            await db.execute(
                "UPDATE projection_checkpoints SET position = $1 WHERE name = $2",
                state.position,
                CHECKPOINT,
            )
            # Told once it commits: gateways read every route again (``REBUILT``).
            await db.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, REBUILT)
        await _commit(transaction)
    return RebuildReport(
        events=count,
        position=state.position,
        rows={table: len(rows) for table, rows in expected.items()},
        differences=differences,
        rewritten=not verify,
    )


async def _commit(transaction: AsyncTransaction) -> None:
    try:
        await transaction.commit()
    except Exception as exc:
        if isinstance(store_error(exc), StoreUnavailable):
            raise CommitOutcomeUnknown(
                "the connection broke once the rebuild's COMMIT was sent"
            ) from exc
        raise


async def _compare(db: asyncpg.Connection, expected: dict[str, list[Row]]) -> list[RowDifference]:
    differences: list[RowDifference] = []
    for table in PROJECTION_TABLES:
        names = tuple(c.name for c in table.columns)
        is_json = json_columns(table)
        keys = [c.name for c in table.primary_key.columns]
        columns = ", ".join(f"{c}::text" if c in is_json else c for c in names)
        live_rows = await db.fetch(f"SELECT {columns} FROM {table.name}")
        live = {_key(dict(zip(names, row, strict=True)), keys): row for row in live_rows}
        wanted = {_key(row, keys): row for row in expected[table.name]}
        for key in sorted(wanted.keys() - live.keys()):
            differences.append(RowDifference(table.name, key, "missing"))
        for key in sorted(live.keys() - wanted.keys()):
            differences.append(RowDifference(table.name, key, "unexpected"))
        for key in sorted(wanted.keys() & live.keys()):
            live_row = dict(zip(names, live[key], strict=True))
            read = {
                column: _read(table.name, column, value, column in is_json)
                for column, value in live_row.items()
            }
            changed = {
                column: (read[column], value)
                for column, value in wanted[key].items()
                if read[column] != _plain(value)
            }
            if changed:
                differences.append(RowDifference(table.name, key, "differs", changed))
    return differences


def _row(difference: SnapshotDifference) -> RowDifference:
    return RowDifference(
        "fold_snapshots",
        f"{difference.position}/{difference.part}/{difference.key}".rstrip("/"),
        difference.problem,
        difference.fields,
    )


def _key(row: Row, keys: list[str]) -> str:
    return "/".join(str(row[k]) for k in keys)


# PostgreSQL keeps a JSON number as an exact decimal and writes it back in full: a float
# recorded as 1e+308 comes back as 1 and 308 zeros, which reads as an int unequal to the
# float. Both sides are read with their fractions and exponents as exact decimals instead.
_json_as_decimals = msgspec.json.Decoder(float_hook=Decimal).decode


def _normal(value: Any, is_json: bool) -> Any:
    if is_json and value is not None:
        return _json_as_decimals(value)
    return value


def _read(table: str, column: str, value: Any, is_json: bool) -> Any:
    """A live column's value as this release reads it, comparable with ``_plain``'s."""
    typed = TYPED_JSON.get((table, column))
    if typed is not None and value is not None:
        try:
            return _plain(msgspec.to_builtins(msgspec.json.decode(value, type=typed)))
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass  # unreadable as its type: compared as it is, and shown so
    return _normal(value, is_json)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value
    if isinstance(value, dict | list | tuple):
        return _json_as_decimals(msgspec.json.encode(value))
    return value


async def write_all_rows(db: asyncpg.Connection, rows: dict[str, list[Row]]) -> None:
    """Insert every row of a fresh projection (after TRUNCATE)."""
    for table in PROJECTION_TABLES:
        await db.execute(
            f"INSERT INTO {table.name} SELECT * FROM "
            f"jsonb_populate_recordset(NULL::{table.name}, $1::jsonb)",
            msgspec.json.encode(rows[table.name]).decode(),
        )


def json_columns(table: Table) -> frozenset[str]:
    return frozenset(c.name for c in table.columns if isinstance(c.type, JSONB))
