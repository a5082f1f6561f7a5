"""Fixtures for tests that write to PostgreSQL: a migrated template, and a fresh database
cloned from it per test (cheap: CREATE DATABASE ... TEMPLATE), so tests never depend on
each other's rows or order.

The template is migrated as production is (``llmgw-server migrate --runtime-role``): by the
server's superuser, which owns the schema, with ``TEST_RUNTIME_ROLE`` set up as the runtime
role. Privileges live in the database, so every clone has them. ``database_url`` is the
owner's URL (tests seed and inspect with it); ``runtime_url`` turns it into the runtime
role's, which every ``llmgw-server serve`` and ``gateway`` process of the tests connects as.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import migrate
from app.store.database import create_engine
from app.store.database_url import parse_database_url
from app.store.grants import RuntimeRole
from app.store.postgres import PostgresEventStore
from tests.support.postgres import PostgresServer, unique_database_name

TEST_RUNTIME_ROLE = RuntimeRole("llmgw_runtime_test", password="llmgw-runtime-test-password")
"""Roles are the whole server's: every test session on one server sets up this same one."""
RUNTIME_ROLE_LOCK_KEY = 0x6C6C6D6777  # "llmgw"


def runtime_url(database_url: str) -> str:
    """``database_url`` (the owner's, one host or several) as the test runtime role
    connects to it."""
    url = parse_database_url(database_url)
    return url.with_credentials(TEST_RUNTIME_ROLE.name, TEST_RUNTIME_ROLE.password).libpq()


def migrate_for_tests(url: str) -> None:
    """Migrate ``url`` to the newest revision with the test runtime role (blocking)."""
    migrate.upgrade(url, runtime=TEST_RUNTIME_ROLE)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def migrated_template(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = unique_database_name("llmgw_template")
    await postgres_server.create_database(name)
    # Sessions sharing a server (pytest -n on LLMGW_TEST_DATABASE_URL) migrate one at a
    # time: each sets up the server-wide runtime role, and two would race to create it.
    admin = await asyncpg.connect(postgres_server.admin_url)
    try:
        await admin.execute("SELECT pg_advisory_lock($1)", RUNTIME_ROLE_LOCK_KEY)
        await asyncio.to_thread(migrate_for_tests, postgres_server.url(name))
    finally:
        await admin.close()
    yield name
    await postgres_server.drop_database(name)


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(
    postgres_server: PostgresServer, migrated_template: str
) -> AsyncIterator[str]:
    name = unique_database_name("llmgw_test")
    await postgres_server.create_database(name, template=migrated_template)
    yield postgres_server.url(name)
    await postgres_server.drop_database(name)


@pytest_asyncio.fixture(loop_scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture
def pg_store(engine: AsyncEngine) -> PostgresEventStore:
    return PostgresEventStore(engine)
