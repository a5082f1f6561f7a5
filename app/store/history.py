"""Reading the log by the keys auditors filter on (indexed columns of ``events``)."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Recorded
from app.store.codec import RECORDED_COLUMNS, record_from_row
from app.store.database import connection


class Subject(StrEnum):
    """What a history is about, and the column that finds its events."""

    REPLICA = "replica"
    NODE = "node"
    MODEL = "model"
    KEY = "key"

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


_NUL = "\x00"
"""PostgreSQL text cannot hold it, so no stored id has one (and a query with it fails)."""


async def read_history(
    engine: AsyncEngine, subject: Subject, key: str, after: int = 0, limit: int = 500
) -> list[Recorded]:
    if _NUL in key:
        return []
    query = (
        f"SELECT {RECORDED_COLUMNS} FROM events WHERE {subject.condition} "
        "AND position > $2 ORDER BY position LIMIT $3"
    )
    async with connection(engine) as db:
        rows = await db.fetch(query, key, after, limit)
    return [record_from_row(row) for row in rows]


async def read_correlated(
    engine: AsyncEngine, correlation_id: str, limit: int = 1000
) -> list[Recorded]:
    """Every step of one operation (a drain, say), in order."""
    if _NUL in correlation_id:
        return []
    query = (
        f"SELECT {RECORDED_COLUMNS} FROM events WHERE correlation_id = $1 "
        "ORDER BY position LIMIT $2"
    )
    async with connection(engine) as db:
        rows = await db.fetch(query, correlation_id, limit)
    return [record_from_row(row) for row in rows]
