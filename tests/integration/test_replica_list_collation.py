"""`GET /admin/v1/replicas` pages over a database created with a language's collation:
ICU's English sorts ``llama_3`` before ``llama1`` (punctuation first), Python, comparing
the fold's replicas byte by byte, after. The forgotten replicas of a page are read in the
fold's order all the same, or the pages would skip some and repeat others."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.state import ENDED_KEPT_PER_MODEL
from app.store.database import connection, create_engine
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, seed_node, serving_admin
from tests.support.databases import RUNTIME_ROLE_LOCK_KEY, migrate_for_tests
from tests.support.postgres import PostgresServer, quote_identifier, unique_database_name
from tests.support.replica_history import declared, ended, record_at_once, serving
from tests.support.replica_pages import ids, listed, paged

TOKEN = secrets.token_hex(16)
K = ENDED_KEPT_PER_MODEL
ICU_ENGLISH = "en-x-icu"


@pytest_asyncio.fixture(loop_scope="session")
async def english_engine(postgres_server: PostgresServer) -> AsyncIterator[AsyncEngine]:
    """A database whose collation is ICU's English, migrated as production is."""
    name = unique_database_name("llmgw_english")
    admin = await asyncpg.connect(postgres_server.admin_url)
    try:
        if await admin.fetchval("SELECT 1 FROM pg_collation WHERE collname = $1", ICU_ENGLISH):
            await admin.execute(
                f"CREATE DATABASE {quote_identifier(name)} TEMPLATE template0 "
                "LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C.UTF-8'"
            )
        else:
            pytest.skip("this PostgreSQL has no ICU collations")
        # As the migrated template is: the runtime role is the whole server's.
        await admin.execute("SELECT pg_advisory_lock($1)", RUNTIME_ROLE_LOCK_KEY)
        await asyncio.to_thread(migrate_for_tests, postgres_server.url(name))
        await admin.execute("SELECT pg_advisory_unlock($1)", RUNTIME_ROLE_LOCK_KEY)
    finally:
        await admin.close()
    engine = create_engine(postgres_server.url(name))
    yield engine
    await engine.dispose()
    await postgres_server.drop_database(name)


async def test_pages_sort_as_the_list_whatever_the_database_s_collation(
    english_engine: AsyncEngine,
) -> None:
    async with connection(english_engine) as db:
        assert await db.fetchval("SELECT 'llama_3' < 'llama1'"), "the database sorts as English"
    store = PostgresEventStore(english_engine)
    await seed_node(store, "gpu-1")
    events = []
    for model in ("llama_3", "llama1"):
        events += [declared(model), *serving(model, 1, "gpu-1")]
        for number in range(2, K + 4):
            events += ended(model, number, "gpu-1")
    await record_at_once(store, events)
    assert "llama1-2" not in store.state.replicas, "forgotten by the fold"
    every = [f"{model}-{n}" for model in ("llama1", "llama_3") for n in range(1, K + 4)]

    async with (
        serving_admin(store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as admin,
    ):
        assert ids(await listed(admin, "")) == every
        assert ids(await paged(admin, "", 3)) == every
        assert ids(await paged(admin, "model=llama_3&", 2)) == every[K + 3 :]
