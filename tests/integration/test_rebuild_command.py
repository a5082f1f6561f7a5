"""``llmgw-server projections rebuild`` refuses what it cannot use in one line, before it
connects: a database URL that is not one, an output it does not write; and, once connected,
a role that may not rewrite the tables, read them, or does not exist, with an exit code of
its own (4), so that a script tells a wrong role from differences found (1); and a log it
cannot check (no such database, a schema not migrated, an event that cannot be decoded)
with another (5), so that ``--verify`` from cron tells "the projections are wrong" from
"they could not be checked"."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from app.domain.envelope import Meta
from app.domain.events import NodeRegistered, node_stream
from app.store.database import driver_url
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.cluster import SERVER
from tests.support.databases import runtime_url
from tests.support.postgres import PostgresServer, quote_identifier, unique_database_name

COMMAND = [SERVER, "projections", "rebuild"]
ROLE_REFUSED = 4
COULD_NOT_CHECK = 5
ROLES_HINT = (
    "the server's administrator creates roles (createuser, or CREATE ROLE), and "
    "`llmgw-server migrate --runtime-role llmgw_runtime` creates the runtime role where the "
    "owner may create roles (docs/operations.md, PostgreSQL)"
)


def url_as(database_url: str, role: str) -> str:
    return make_url(database_url).set(username=role, password=None).render_as_string(False)


async def rebuild(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [*COMMAND, "--database-url", url, *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--database-url", "postgresql://llmgw:hunter2@db-a:5432,,db-b/x"],
            "llmgw-server projections rebuild: "
            "--database-url: the database URL 'postgresql://llmgw:***@db-a:5432,,db-b/x' "
            "has an empty host in its list of hosts",
        ),
        (
            ["--database-url", "postgresql://llmgw@127.0.0.1:1/x", "--output", "xml"],
            "llmgw-server projections rebuild: --output is text or json, not 'xml'",
        ),
    ],
)
def test_what_it_cannot_use_is_refused_in_one_line(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [*COMMAND, *flags], capture_output=True, text=True, check=False, timeout=60
    )

    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [message], done.stderr


async def test_rewriting_as_the_runtime_role_is_refused_in_one_line_saying_who_may(
    database_url: str,
) -> None:
    """The runtime role may read the projection tables, not truncate them: rebuilding
    without --verify is the owner's work, and the line says so (not a traceback)."""
    done = await rebuild(runtime_url(database_url))

    assert (done.returncode, done.stdout) == (ROLE_REFUSED, ""), done
    assert done.stderr.splitlines() == [
        "llmgw-server projections rebuild: permission denied for table models; rebuilding "
        "writes the projection tables directly: run it as the role that owns them (the one "
        "that runs migrate), or use --verify"
    ], done.stderr


@pytest_asyncio.fixture(loop_scope="session")
async def bare_role(postgres_server: PostgresServer, database_url: str) -> AsyncIterator[str]:
    """A role that may log in and was granted nothing on llmgw's tables."""
    role = f"llmgw_bare_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_server.admin_url)
    try:
        await admin.execute(f"CREATE ROLE {quote_identifier(role)} LOGIN")
        yield role
        await admin.execute(f"DROP ROLE {quote_identifier(role)}")
    finally:
        await admin.close()


async def test_verifying_as_a_role_that_may_not_read_the_tables_is_no_difference_found(
    database_url: str, bare_role: str
) -> None:
    done = await rebuild(url_as(database_url, bare_role), "--verify")

    assert (done.returncode, done.stdout) == (ROLE_REFUSED, ""), done
    assert done.stderr.splitlines() == [
        "llmgw-server projections rebuild: permission denied for table fold_snapshots"
    ], done.stderr


async def test_a_role_that_does_not_exist_is_no_difference_found(database_url: str) -> None:
    done = await rebuild(url_as(database_url, f"llmgw_gone_{uuid.uuid4().hex[:8]}"), "--verify")

    assert (done.returncode, done.stdout) == (ROLE_REFUSED, ""), done
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "does not exist" in done.stderr


@pytest.mark.parametrize(
    ("flags", "who_may"),
    [
        (["--verify"], "a role that may read the projection tables (the runtime role may)"),
        ([], "the role that owns the projection tables (the one that runs migrate)"),
    ],
)
async def test_a_role_that_does_not_exist_is_told_so_and_how_roles_are_made(
    database_url: str, flags: list[str], who_may: str
) -> None:
    # Before, PostgreSQL's own words alone: nothing said which role to use, nor who makes it.
    role = f"llmgw_gone_{uuid.uuid4().hex[:8]}"

    done = await rebuild(url_as(database_url, role), *flags)

    assert (done.returncode, done.stdout) == (ROLE_REFUSED, ""), done
    assert done.stderr.splitlines() == [
        f'llmgw-server projections rebuild: the role "{role}" of --database-url '
        "(LLMGW_DATABASE_URL) does not exist on this PostgreSQL server; connect as "
        f"{who_may}: {ROLES_HINT}"
    ], done.stderr


async def test_a_database_that_does_not_exist_is_not_a_difference_found(
    postgres_server: PostgresServer,
) -> None:
    missing = unique_database_name("llmgw_missing")

    done = await rebuild(postgres_server.url(missing), "--verify")

    assert (done.returncode, done.stdout) == (COULD_NOT_CHECK, ""), done
    assert done.stderr.splitlines() == [
        "llmgw-server projections rebuild: cannot verify the projections: database error: "
        f'database "{missing}" does not exist (check the database name of --database-url, '
        "LLMGW_DATABASE_URL); nothing was changed (--verify only reads)"
    ], done.stderr


@pytest_asyncio.fixture(loop_scope="session")
async def unmigrated_url(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = unique_database_name("llmgw_unmigrated")
    await postgres_server.create_database(name)
    yield postgres_server.url(name)
    await postgres_server.drop_database(name)


@pytest.mark.parametrize(("flags", "action"), [(["--verify"], "verify"), ([], "rebuild")])
async def test_a_schema_not_migrated_is_not_a_difference_found(
    unmigrated_url: str, flags: list[str], action: str
) -> None:
    done = await rebuild(unmigrated_url, *flags)

    assert (done.returncode, done.stdout) == (COULD_NOT_CHECK, ""), done
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(
        f"llmgw-server projections rebuild: cannot {action} the projections: "
    ), done.stderr
    assert "does not exist (is the database at the newest revision? llmgw-server migrate)" in (
        done.stderr
    )


async def test_an_event_that_cannot_be_decoded_is_not_a_difference_found(
    database_url: str, pg_store: PostgresEventStore
) -> None:
    """An event of a type this release does not know (a newer release's, or one edited):
    the projections cannot be checked against a log that cannot be read, and are left as
    they are."""
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    [recorded] = await pg_store.append(
        node_stream(node),
        None,
        [NewEvent(NodeRegistered(node_id=node, address="h"))],
        Meta(actor="alice"),
    )
    position = recorded.position
    await _as_superuser_without_triggers(
        database_url, "UPDATE events SET type = 'node_teleported' WHERE position = $1", position
    )

    for flags, action, done_line in [
        (["--verify"], "verify", "nothing was changed (--verify only reads)"),
        ([], "rebuild", "nothing was changed: the rebuild is one transaction, never committed"),
    ]:
        done = await rebuild(database_url, *flags)

        assert (done.returncode, done.stdout) == (COULD_NOT_CHECK, ""), done
        assert done.stderr.splitlines() == [
            f"llmgw-server projections rebuild: cannot {action} the projections: event "
            f"{position} (node_teleported) cannot be decoded: unknown event type; {done_line}"
        ], done.stderr


async def _as_superuser_without_triggers(database_url: str, statement: str, *args: object) -> None:
    connection = await asyncpg.connect(driver_url(database_url))
    try:
        async with connection.transaction():
            await connection.execute("SET LOCAL session_replication_role = replica")
            await connection.execute(statement, *args)
    finally:
        await connection.close()
