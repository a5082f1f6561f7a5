"""``rate_budgets`` on real PostgreSQL: grants never give more than the minute leaves, even
to many gateways asking at once; what is released can be granted again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from app.store.database import driver_url
from app.store.rate_budgets import grant, release
from tests.support.databases import runtime_url

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
