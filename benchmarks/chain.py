"""What the event log's chain hash costs, for ``benchmarks/eventstore.py``.

- **Per append**: the same store and the same ``llmgw_append`` with and without the chain
  hash. The "without" side is a copy of the installed function in a schema of its own,
  identical but for the one statement that hashes an event (it keeps the previous hash
  instead, so the rows stay as wide); a store whose connections put that schema first on
  their ``search_path`` calls it. Everything else, the Python side included, is the same.
- **Verifying**: ``verify_log`` over the whole log, in a process of its own for its peak
  memory (see ``benchmarks/children.py``).
- **Chaining a log that has none**: migration 0005's upgrade on the loaded log, after a
  downgrade to 0004 (which drops the chain's columns).

A copy without the chain breaks the chain of the log it appends to, so these run last.
"""

from __future__ import annotations

import asyncio
import re
import time

import asyncpg
import msgspec

from app.store import migrate

UNCHAINED_SCHEMA = "bench_unchained"
_HASH_STATEMENT = re.compile(r"v_head := sha256\(v_head \|\| llmgw_event_bytes\(.*?\)\);", re.S)


class Backfill(msgspec.Struct, frozen=True):
    events: int
    seconds: float
    """``upgrade 0004 -> 0005`` (the backfill of every event), timed around the call."""
    events_per_s: float


async def install_unchained_append(db: asyncpg.Connection) -> None:
    """``bench_unchained.llmgw_append``: the installed function without the hashing."""
    definition: str = await db.fetchval("SELECT pg_get_functiondef('llmgw_append'::regproc)")
    unchained, hashes = _HASH_STATEMENT.subn("v_head := v_head;", definition)
    unchained, names = re.subn(
        r"FUNCTION public\.llmgw_append\(", f"FUNCTION {UNCHAINED_SCHEMA}.llmgw_append(", unchained
    )
    if (hashes, names) != (1, 1):
        raise RuntimeError("llmgw_append no longer has the one hashing statement this expects")
    await db.execute(f"CREATE SCHEMA IF NOT EXISTS {UNCHAINED_SCHEMA}")
    await db.execute(unchained)


async def measure_backfill(url: str, events: int) -> Backfill:
    await asyncio.to_thread(migrate.downgrade, url, "0004")
    started = time.perf_counter()
    await asyncio.to_thread(migrate.upgrade, url)
    seconds = time.perf_counter() - started
    return Backfill(events, round(seconds, 2), round(events / seconds))
