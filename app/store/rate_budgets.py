"""The slices of keys' per-minute limits that gateways lease: live state, not events.

``rate_budgets`` holds, per key, resource (``rpm`` or ``tpm``) and second of the
database's clock, what gateways were granted of the key's limit in that second, less what
they returned unused. ``grant`` gives a gateway up to what it wants of what the last
minute leaves: the rows of the current second and the 60 before it are summed, so a
grant made at second ``s`` counts until second ``s + 61`` (a whole minute and up to one
second more: the count never under-counts a sliding minute). The sum and the insert run
under a transaction-scoped advisory lock of the key and resource, so two gateways asking
at once are served one after the other and never both given the same room.

``release`` gives back what a gateway did not use of a grant, to the second it was granted
in. A gateway that dies returns nothing: its slices count until they age out.

A grant deletes its own key's aged rows; ``forget_aged`` deletes every key's, for the keys
that are never granted again (revoked, expired, or no longer used): without it each such
key would keep the rows of its last two minutes for ever. It deletes at most
``FORGET_BATCH`` rows a statement, skipping rows another gateway's statement holds, so a
backlog never makes one statement slow and two gateways never wait on each other.
"""

from __future__ import annotations

import asyncpg
import msgspec

WINDOW_SECONDS = 60
KEEP_SECONDS = 120
"""Rows older than this are deleted by the key's next grant, or by ``forget_aged``."""
FORGET_BATCH = 5000
"""Aged rows ``forget_aged`` deletes at most, in one statement."""

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"

_GRANT = f"""
WITH clock AS (
    SELECT extract(epoch FROM clock_timestamp())::float8 AS now
), used AS (
    SELECT coalesce(sum(granted), 0)::bigint AS used,
           min(second) FILTER (WHERE granted > 0) AS oldest
    FROM rate_budgets, clock
    WHERE key_id = $1 AND resource = $2
      AND second >= floor(clock.now)::bigint - {WINDOW_SECONDS}
), give AS (
    SELECT greatest(0, least($4::bigint, $3::bigint - used.used)) AS amount,
           floor(clock.now)::bigint AS second, used.used, used.oldest, clock.now
    FROM used, clock
), written AS (
    INSERT INTO rate_budgets (key_id, resource, second, granted)
    SELECT $1, $2, give.second, give.amount FROM give WHERE give.amount > 0
    ON CONFLICT (key_id, resource, second)
    DO UPDATE SET granted = rate_budgets.granted + excluded.granted
    RETURNING 1
)
SELECT give.amount, give.second, give.used + give.amount AS used,
       CASE WHEN give.oldest IS NULL AND give.amount = 0 THEN 0.0
            ELSE greatest(0.0, coalesce(give.oldest, give.second) + {WINDOW_SECONDS + 1}
                               - give.now) END AS room_in_s
FROM give
"""

_PRUNE = """
DELETE FROM rate_budgets
WHERE key_id = $1 AND resource = $2
  AND second < floor(extract(epoch FROM clock_timestamp()))::bigint - $3
"""

_FORGET_AGED = """
DELETE FROM rate_budgets
WHERE (key_id, resource, second) IN (
    SELECT key_id, resource, second FROM rate_budgets
    WHERE second < floor(extract(epoch FROM clock_timestamp()))::bigint - $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
"""

_RELEASE = """
UPDATE rate_budgets SET granted = greatest(0, granted - $4)
WHERE key_id = $1 AND resource = $2 AND second = $3
"""

_LIVE_GATEWAYS = """
SELECT count(*)::int FROM gateway_reports
WHERE reported_at > now() - make_interval(secs => $1)
"""


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    amount: int
    """What the gateway may use: 0 when the last minute leaves nothing."""
    second: int
    """The database's second it was granted in: what ``release`` gives back to."""
    used: int
    """The key's count over the last minute, this grant included."""
    room_in_s: float
    """When nothing is left: seconds until the oldest grant of the minute (this one, when
    the minute held none before it) ages out."""


async def grant(
    db: asyncpg.Connection, key_id: str, resource: str, limit: int, want: int, *, within_s: float
) -> Grant:
    """Up to ``want`` of what ``limit`` leaves of the key's last minute."""
    async with db.transaction():
        await db.execute(_LOCK, f"{resource}:{key_id}", timeout=within_s)
        row = await db.fetchrow(_GRANT, key_id, resource, limit, want, timeout=within_s)
        await db.execute(_PRUNE, key_id, resource, KEEP_SECONDS, timeout=within_s)
    assert row is not None
    return Grant(
        amount=int(row["amount"]),
        second=int(row["second"]),
        used=int(row["used"]),
        room_in_s=float(row["room_in_s"]),
    )


async def release(
    db: asyncpg.Connection, key_id: str, resource: str, second: int, amount: int, *, within_s: float
) -> None:
    """Give back ``amount`` of a grant made at ``second`` that was not used."""
    await db.execute(_RELEASE, key_id, resource, second, amount, timeout=within_s)


async def forget_aged(db: asyncpg.Connection, *, within_s: float) -> int:
    """Delete up to ``FORGET_BATCH`` rows of any key older than ``KEEP_SECONDS``; how many
    were deleted (``FORGET_BATCH``: there may be more)."""
    status = await db.execute(_FORGET_AGED, KEEP_SECONDS, FORGET_BATCH, timeout=within_s)
    return int(status.rsplit(" ", 1)[-1])


async def live_gateways(db: asyncpg.Connection, max_age_s: float, *, within_s: float) -> int:
    """Gateways whose report is younger than ``max_age_s``."""
    count = await db.fetchval(_LIVE_GATEWAYS, max_age_s, timeout=within_s)
    return int(count or 0)
