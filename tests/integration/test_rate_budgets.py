"""``rate_budgets`` on real PostgreSQL: grants never give more than the minute leaves, even
to many gateways asking at once; what is released can be granted again; rows of keys no
longer granted do not stay for ever."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from app.gateway.budget_keeper import BudgetKeeper
from app.gateway.sharedlimits import SharedLimiter
from app.store.database import driver_url
from app.store.rate_budgets import KEEP_SECONDS, grant, release
from tests.support.databases import runtime_url
from tests.support.waiting import wait_until

WITHIN_S = 5.0


@pytest_asyncio.fixture(loop_scope="session")
async def gateways(database_url: str) -> AsyncIterator[list[asyncpg.Connection]]:
    """Eight connections as the runtime role, as eight gateways would hold."""
    url = driver_url(runtime_url(database_url))
    connections = [await asyncpg.connect(url) for _ in range(8)]
    yield connections
    for connection in connections:
        await connection.close()


async def test_concurrent_grants_never_exceed_the_limit(
    gateways: list[asyncpg.Connection],
) -> None:
    key = f"key-{uuid.uuid4().hex}"

    async def take_all(db: asyncpg.Connection) -> int:
        total = 0
        for _ in range(40):
            total += (await grant(db, key, "rpm", 600, 7, within_s=WITHIN_S)).amount
        return total

    granted = await asyncio.gather(*(take_all(db) for db in gateways))
    assert sum(granted) == 600, granted
    last = await grant(gateways[0], key, "rpm", 600, 7, within_s=WITHIN_S)
    assert last.amount == 0
    assert last.used == 600
    assert 0 < last.room_in_s <= 61


async def test_released_budget_can_be_granted_again(gateways: list[asyncpg.Connection]) -> None:
    key = f"key-{uuid.uuid4().hex}"
    db = gateways[0]
    first = await grant(db, key, "tpm", 1000, 1000, within_s=WITHIN_S)
    assert first.amount == 1000
    assert (await grant(db, key, "tpm", 1000, 1, within_s=WITHIN_S)).amount == 0
    await release(db, key, "tpm", first.second, 300, within_s=WITHIN_S)
    again = await grant(db, key, "tpm", 1000, 500, within_s=WITHIN_S)
    assert again.amount == 300
    assert (await grant(db, key, "rpm", 10, 10, within_s=WITHIN_S)).amount == 10, (
        "each resource has a budget of its own"
    )


async def test_a_grant_that_spends_an_idle_keys_minute_says_when_room_comes_back(
    gateways: list[asyncpg.Connection],
) -> None:
    """The first grant of a key idle for a minute takes all of it: nothing older is in the
    ledger, and the room comes back when this grant ages out, not at once."""
    key = f"key-{uuid.uuid4().hex}"
    whole = await grant(gateways[0], key, "rpm", 2, 2, within_s=WITHIN_S)
    assert (whole.amount, whole.used) == (2, 2)
    assert 60 < whole.room_in_s <= 61, whole


async def test_a_gateway_deletes_the_aged_rows_of_keys_never_granted_again(
    database_url: str, gateways: list[asyncpg.Connection]
) -> None:
    """A revoked key, or one no longer used, is never granted again, so no grant of its own
    deletes its last rows: a gateway's budget keeper deletes every key's aged rows, and
    leaves the minute's rows of a key in use as they are."""
    gone, in_use = f"key-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    db = gateways[0]
    for seconds_ago in (KEEP_SECONDS + 1, 600, 86_400):
        for resource in ("rpm", "tpm"):
            await db.execute(
                "INSERT INTO rate_budgets (key_id, resource, second, granted) VALUES "
                "($1, $2, floor(extract(epoch FROM clock_timestamp()))::bigint - $3, 5)",
                gone,
                resource,
                seconds_ago,
            )
    assert (await grant(db, in_use, "rpm", 10, 4, within_s=WITHIN_S)).amount == 4

    async def rows_of(key: str) -> int:
        count = await db.fetchval("SELECT count(*) FROM rate_budgets WHERE key_id = $1", key)
        return int(count)

    async def gone_forgotten() -> bool:
        return await rows_of(gone) == 0

    keeper = BudgetKeeper(
        runtime_url(database_url), SharedLimiter(), gateway_id=f"gw-{uuid.uuid4().hex[:8]}"
    )
    await keeper.start()
    try:
        await wait_until(gone_forgotten, what="the aged rows of a key never granted again deleted")
    finally:
        await keeper.close()
    assert await rows_of(in_use) == 1
    assert (await grant(db, in_use, "rpm", 10, 10, within_s=WITHIN_S)).amount == 6, (
        "the minute's grant still counts"
    )
