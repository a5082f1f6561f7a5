"""Fixtures for tests that write to PostgreSQL: a migrated template, and a fresh database
cloned from it per test (cheap: CREATE DATABASE ... TEMPLATE), so tests never depend on
each other's rows or order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import migrate
from app.store.database import create_engine
from app.store.postgres import PostgresEventStore
from tests.support.postgres import PostgresServer, unique_database_name


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def migrated_template(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = unique_database_name("llmgw_template")
    await postgres_server.create_database(name)
    await asyncio.to_thread(migrate.upgrade, postgres_server.url(name))
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
