"""The event-store benchmark's ``--guards`` baseline is the installed ``llmgw_append``
without migration 0017's changes: on a database at 0019, the last revision before
``llmgw_append`` changed again (0020), the copy it builds by undoing them has the text a
database at 0016 holds, in a schema of its own; at head it is built too; and the installed
one is left as it was."""

from __future__ import annotations

import asyncio

import asyncpg

from app.store import migrate
from benchmarks.append_guards import UNGUARDED_SCHEMA, install_unguarded_append
from tests.support.postgres import PostgresServer, unique_database_name

DEFINITION = "SELECT pg_get_functiondef(to_regproc($1))"
LAST_BEFORE_LATER_CHANGES = "0019"
"""The last revision whose ``llmgw_append`` is 0017's: 0020 adds the deletion of forgotten
replicas, which the baseline keeps as the installed function does."""


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
            await asyncio.to_thread(migrate.upgrade, url, LAST_BEFORE_LATER_CHANGES)
            guarded = await db.fetchval(DEFINITION, "public.llmgw_append")

            await install_unguarded_append(db, grantee="PUBLIC")

            copy = await db.fetchval(DEFINITION, f"{UNGUARDED_SCHEMA}.llmgw_append")
            assert await db.fetchval(DEFINITION, "public.llmgw_append") == guarded

            await asyncio.to_thread(migrate.upgrade, url)
            at_head = await db.fetchval(DEFINITION, "public.llmgw_append")
            await install_unguarded_append(db, grantee="PUBLIC")  # raises where it cannot
            assert await db.fetchval(DEFINITION, "public.llmgw_append") == at_head
        finally:
            await db.close()
    finally:
        await postgres_server.drop_database(name)
    assert guarded != at_0016
    assert copy == at_0016.replace(
        "FUNCTION public.llmgw_append(", f"FUNCTION {UNGUARDED_SCHEMA}.llmgw_append("
    )
