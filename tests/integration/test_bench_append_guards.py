"""The event-store benchmark's ``--guards`` baseline is migration 0016's ``llmgw_append``
exactly: the copy it builds from the installed function by undoing 0017's changes has the
text a database at 0016 holds, in a schema of its own, and the installed one is left as
it was."""

from __future__ import annotations

import asyncio

import asyncpg

from app.store import migrate
from benchmarks.append_guards import UNGUARDED_SCHEMA, install_unguarded_append
from tests.support.postgres import PostgresServer, unique_database_name

DEFINITION = "SELECT pg_get_functiondef(to_regproc($1))"


async def test_the_copy_without_the_guards_is_0016s_function(
    postgres_server: PostgresServer,
) -> None:
    name = unique_database_name("llmgw_bench_guards")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    try:
        await asyncio.to_thread(migrate.upgrade, url, "0016")
        db = await asyncpg.connect(url)
        try:
            at_0016 = await db.fetchval(DEFINITION, "public.llmgw_append")
            await asyncio.to_thread(migrate.upgrade, url)
            guarded = await db.fetchval(DEFINITION, "public.llmgw_append")

            await install_unguarded_append(db, grantee="PUBLIC")

            copy = await db.fetchval(DEFINITION, f"{UNGUARDED_SCHEMA}.llmgw_append")
            assert await db.fetchval(DEFINITION, "public.llmgw_append") == guarded
        finally:
            await db.close()
    finally:
        await postgres_server.drop_database(name)
    assert guarded != at_0016
    assert copy == at_0016.replace(
        "FUNCTION public.llmgw_append(", f"FUNCTION {UNGUARDED_SCHEMA}.llmgw_append("
    )
