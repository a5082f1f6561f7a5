"""An admin API over the test's PostgreSQL store that two operators, alice and bob, may
call with their own tokens: ``admin_url``, and a client for each (``alice``, ``bob``)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, serving_admin

ALICE_TOKEN = secrets.token_hex(16)
BOB_TOKEN = secrets.token_hex(16)


@pytest_asyncio.fixture(loop_scope="session")
async def admin_url(pg_store: PostgresEventStore) -> AsyncIterator[str]:
    async with serving_admin(pg_store, tokens={ALICE_TOKEN: "alice", BOB_TOKEN: "bob"}) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def alice(admin_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with bearer_client(admin_url, ALICE_TOKEN) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def bob(admin_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with bearer_client(admin_url, BOB_TOKEN) as client:
        yield client
