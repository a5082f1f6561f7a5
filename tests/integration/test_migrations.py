"""Migrations go up, down and up again on an empty database."""

from __future__ import annotations

import asyncio

import asyncpg

from app.store import migrate
from tests.support.postgres import PostgresServer, unique_database_name

TABLES = {
    "events",
    "models",
    "nodes",
    "replicas",
    "shards",
    "api_keys",
    "projection_checkpoints",
    "gateway_reports",
}
VIEWS = {"audit_log", "replica_history", "node_history", "routing_table"}


async def _relations(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        functions = await conn.fetch("SELECT proname FROM pg_proc WHERE proname LIKE 'llmgw_%'")
    finally:
        await conn.close()
    return {r[0] for r in rows} | {r[0] for r in functions}


async def test_upgrade_downgrade_upgrade(postgres_server: PostgresServer) -> None:
    name = unique_database_name("llmgw_migrations")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        assert TABLES | VIEWS | {"llmgw_append"} <= await _relations(url)

        await asyncio.to_thread(migrate.downgrade, url, "base")
        assert await _relations(url) == {"alembic_version"}

        await asyncio.to_thread(migrate.upgrade, url)
        assert TABLES | VIEWS | {"llmgw_append"} <= await _relations(url)
    finally:
        await postgres_server.drop_database(name)
