"""Walking the stored log against its chain (``llmgw-server log verify``) and reading its head
(``llmgw-server log head``).

The walk reads through a server-side cursor, a page at a time, in one read-only snapshot: it
holds one page in memory however long the log is, and appends made meanwhile neither show up
half-way nor count as breaks. Any role that can read ``events`` can run it, the runtime role
included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import asyncpg
import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.chain import (
    CHAIN_COLUMNS,
    GENESIS,
    Break,
    ChainWalk,
    Head,
    Problem,
    missing_predecessor,
    relinked,
    stored_row,
)
from app.store.database import (
    answer_error,
    driver_connection,
    dropped_when_broken,
    translated_errors,
)

PAGE = 5_000
"""Events fetched from the cursor at a time."""

Progress = Callable[[int, int, int], None]
"""Called after each page with (events checked, position reached, last position)."""


class Verification(msgspec.Struct, frozen=True):
    events: int
    """Events that checked out (all of them, when nothing broke)."""
    head: Head
    """The last event that checked out."""
    anchors: list[Head]
    """Anchors the chain was found to pass through."""
    broken: Break | None

    @property
    def ok(self) -> bool:
        return self.broken is None


async def verify_log(
    engine: AsyncEngine, anchors: Sequence[Head] = (), progress: Progress | None = None
) -> Verification:
    walk = ChainWalk(anchors)
    async with _reading(), engine.connect() as conn, dropped_when_broken(conn):
        await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
        db = await driver_connection(conn)
        last = int(await db.fetchval("SELECT coalesce(max(position), 0) FROM events"))
        cursor = await db.cursor(f"SELECT {CHAIN_COLUMNS} FROM events ORDER BY position")
        broken: Break | None = None
        while broken is None:
            rows = await cursor.fetch(PAGE)
            if not rows:
                broken = walk.finish()
                break
            for row in rows:
                broken = walk.step(stored_row(row))
                if broken is not None:
                    break
            if progress is not None:
                progress(walk.events, walk.head.position, last)
        if broken is not None and broken.problem is Problem.INSERTED:
            broken = await _disown_inserted(db, walk, broken)
    return Verification(walk.events, walk.head, walk.anchors_passed, broken)


async def _disown_inserted(db: asyncpg.Connection, walk: ChainWalk, broken: Break) -> Break:
    """The break moved to the first inserted event, and the walk back to the event they
    were inserted after (``ChainWalk.disown``); read in the walk's snapshot. When no event
    holds the position named as the predecessor (a gap, or one no append ever took), that
    event is what is missing, and the walk stands: everything it checked linked as appended.
    So it does when the event naming that predecessor does not hash as its successor
    (``relinked``): that event was changed, not the ones before it inserted."""
    after = broken.inserted_after or 0
    if after != 0 and not await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM events WHERE position = $1)", after
    ):
        return missing_predecessor(after, broken)
    stored = await db.fetchval("SELECT chain_hash FROM events WHERE position = $1", after)
    genuine = Head(after, GENESIS if after == 0 else bytes(stored))
    naming = await db.fetchrow(
        f"SELECT {CHAIN_COLUMNS} FROM events WHERE position = $1", broken.appended_next
    )
    changed = relinked(stored_row(naming), genuine.chain_hash)
    if changed is not None:
        return changed
    first, inserted = await db.fetchrow(
        "SELECT min(position), count(*) FROM events WHERE position > $1 AND position <= $2",
        after,
        broken.position,
    )
    walk.disown(int(inserted), genuine)
    return msgspec.structs.replace(broken, position=int(first))


class UnhashedHead(msgspec.Struct, frozen=True):
    """The last event has no chain hash (someone emptied the column), or one that is no
    sha256: the log has no head to record (none that ``--anchor`` would take back), and the
    chain is broken at ``position`` at the latest."""

    position: int
    why: str = "has no chain hash"


async def read_head(engine: AsyncEngine) -> Head | UnhashedHead:
    """The last event's position and chain hash; position 0 and the genesis hash when the
    log is empty."""
    async with _reading(), engine.connect() as conn, dropped_when_broken(conn):
        db = await driver_connection(conn)
        row = await db.fetchrow(
            "SELECT position, chain_hash FROM events ORDER BY position DESC LIMIT 1"
        )
    if row is None:
        return Head(0, GENESIS)
    if row["chain_hash"] is None:
        return UnhashedHead(row["position"])
    chain_hash = bytes(row["chain_hash"])
    if len(chain_hash) != len(GENESIS):
        size = f"{len(chain_hash)} byte{'' if len(chain_hash) == 1 else 's'}"
        return UnhashedHead(row["position"], f"has a chain hash of {size}, not {len(GENESIS)}")
    return Head(row["position"], chain_hash)


@asynccontextmanager
async def _reading() -> AsyncIterator[None]:
    """Errors become ``StoreError``s: those of the connection as everywhere, and those
    PostgreSQL answers the queries above with (no ``events`` table in a database never
    migrated, no privilege to read it), which reach this module straight from the driver."""
    try:
        async with translated_errors():
            yield
    except asyncpg.PostgresError as exc:
        raise answer_error(exc) from exc
