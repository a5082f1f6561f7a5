"""Reading the log by the keys auditors filter on (indexed columns of ``events``)."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Recorded
from app.domain.rollout_history import ROLLOUT_EVENT_PREFIX
from app.store.codec import RECORDED_COLUMNS, record_from_row
from app.store.database import connection


class Subject(StrEnum):
    """What a history is about, and the column that finds its events."""

    REPLICA = "replica"
    NODE = "node"
    MODEL = "model"
    KEY = "key"
    CERTIFICATE = "certificate"

    @property
    def condition(self) -> str:
        match self:
            case Subject.REPLICA:
                return "replica_id = $1"
            case Subject.NODE:
                return "node_id = $1"
            case Subject.MODEL:
                return "model = $1"
            case Subject.KEY:
                return "stream = 'key-' || $1"
            case Subject.CERTIFICATE:
                return "stream = 'certificate-' || $1"


_AFTER_EVERY_POSITION = 2**63 - 1
"""The largest position a bigint holds: ``position < it`` is every event."""
_NUL = "\x00"
"""PostgreSQL text cannot hold it, so no stored id has one (and a query with it fails)."""


async def read_history(
    engine: AsyncEngine,
    subject: Subject,
    key: str,
    after: int = 0,
    limit: int = 500,
    *,
    before: int | None = None,
) -> list[Recorded]:
    """The first ``limit`` events about ``key`` after position ``after``; with ``before``,
    the last ``limit`` of those before position ``before`` instead. Oldest first either
    way."""
    if _NUL in key:
        return []
    if before is None:
        query = (
            f"SELECT {RECORDED_COLUMNS} FROM events WHERE {subject.condition} "
            "AND position > $2 ORDER BY position LIMIT $3"
        )
        arguments: tuple[object, ...] = (key, after, limit)
    else:
        query = (
            f"SELECT {RECORDED_COLUMNS} FROM events WHERE {subject.condition} "
            "AND position > $2 AND position < $3 ORDER BY position DESC LIMIT $4"
        )
        arguments = (key, after, before, limit)
    async with connection(engine) as db:
        rows = await db.fetch(query, *arguments)
    recorded = [record_from_row(row) for row in rows]
    return recorded if before is None else recorded[::-1]


async def read_correlated(
    engine: AsyncEngine, correlation_id: str, limit: int = 1000, *, newest: bool = False
) -> list[Recorded]:
    """The steps of one operation (a drain, say), in order: its first ``limit``, or with
    ``newest`` its last ``limit`` (``events_correlation_id_idx`` read backwards)."""
    if _NUL in correlation_id:
        return []
    order = "DESC" if newest else "ASC"
    query = (
        f"SELECT {RECORDED_COLUMNS} FROM events WHERE correlation_id = $1 "
        f"ORDER BY position {order} LIMIT $2"
    )
    async with connection(engine) as db:
        rows = await db.fetch(query, correlation_id, limit)
    recorded = [record_from_row(row) for row in rows]
    return recorded[::-1] if newest else recorded


async def read_last_scaled(engine: AsyncEngine, stream: str, actor: str) -> Recorded | None:
    """The last ``model_scaled`` in a model's ``stream`` that ``actor`` recorded (the
    autoscaler's last decision), or None."""
    if _NUL in stream or _NUL in actor:
        return None
    query = (
        f"SELECT {RECORDED_COLUMNS} FROM events WHERE stream = $1 AND type = 'model_scaled' "
        "AND actor = $2 ORDER BY version DESC LIMIT 1"
    )
    async with connection(engine) as db:
        row = await db.fetchrow(query, stream, actor)
    return record_from_row(row) if row is not None else None


async def read_rollouts(
    engine: AsyncEngine, stream: str, before: int | None = None, limit: int = 20
) -> tuple[list[Recorded], int | None]:
    """The rollout events of a model's ``stream`` (``rollout_*``), and the declarations that
    started them, oldest first, for its ``limit`` latest rollouts started before position
    ``before``; and the position to pass as ``before`` for older ones (None when there are
    none)."""
    if _NUL in stream:
        return [], None
    starts_query = (
        "SELECT position, version, data->>'rollout_id' FROM events "
        "WHERE stream = $1 AND type = 'rollout_started' AND position < $2 "
        "ORDER BY position DESC LIMIT $3"
    )
    # The declaration that started a rollout is the stream's event just before its start:
    # the two are recorded in one append.
    events_query = (
        f"SELECT {RECORDED_COLUMNS} FROM events WHERE stream = $1 AND ("
        "(starts_with(type, $2) AND data->>'rollout_id' = ANY($3::text[])) "
        "OR (type = 'model_declared' AND version = ANY($4::int[]))) ORDER BY position"
    )
    async with connection(engine) as db:
        below = _AFTER_EVERY_POSITION if before is None else before
        starts = await db.fetch(starts_query, stream, below, limit + 1)
        page, more = starts[:limit], len(starts) > limit
        if not page:
            return [], None
        rows = await db.fetch(
            events_query,
            stream,
            ROLLOUT_EVENT_PREFIX,
            [row[2] for row in page],
            [row[1] - 1 for row in page],
        )
    return [record_from_row(row) for row in rows], page[-1][0] if more else None
