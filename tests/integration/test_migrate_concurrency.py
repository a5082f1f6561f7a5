"""Two ``migrate`` runs at once (every host's unit migrating before it serves, two deploy
pipelines) take turns: the first applies the revisions, the second finds them applied."""

from __future__ import annotations

import asyncio
import os

import asyncpg

from app.store import migrate
from tests.support.cluster import SERVER
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.waiting import wait_until


async def _waiting_on_locks(url: str, database: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        waiting: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
            database,
        )
    finally:
        await conn.close()
    return waiting


async def _migrate(url: str) -> tuple[int, str]:
    """``llmgw-server migrate`` in a process of its own: its exit code and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    process = await asyncio.create_subprocess_exec(
        SERVER,
        "migrate",
        env={**env, "LLMGW_DATABASE_URL": url},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def _revision(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        revision: str = await conn.fetchval("SELECT version_num FROM alembic_version")
    finally:
        await conn.close()
    return revision


async def test_two_migrate_runs_at_once_both_succeed_and_apply_each_revision_once(
    postgres_server: PostgresServer,
) -> None:
    """Given a database of an older release (0013) and a reader holding a table that
    revision 0015 alters, when two runs start, both are kept waiting; once the reader lets
    go, both exit 0 at the newest revision (the second used to apply 0014 again and
    fail with ``column "expires_at" of relation "api_keys" already exists``)."""
    name = unique_database_name("llmgw_migrate_twice")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    try:
        await asyncio.to_thread(migrate.upgrade, url, "0013")
        reader = await asyncpg.connect(url)
        try:
            reading = reader.transaction()
            await reading.start()
            await reader.execute("LOCK TABLE gateway_reports IN ACCESS SHARE MODE")
            runs = [asyncio.create_task(_migrate(url)) for _ in "ab"]

            async def both_waiting() -> bool:
                return await _waiting_on_locks(url, name) == 2

            await wait_until(both_waiting, within_s=60, what="both runs waiting")
            await reading.rollback()
            outcomes = await asyncio.gather(*runs)
        finally:
            await reader.close()

        assert outcomes == [(0, ""), (0, "")]
        assert await _revision(url) == migrate.head_revision()
    finally:
        await postgres_server.drop_database(name)
