"""``llmgw-server projections rebuild`` refuses what it cannot use in one line, before it
connects: a database URL that is not one, an output it does not write; and, once connected,
a role that may not rewrite the tables, read them, or does not exist, with an exit code of
its own (4), so that a script tells a wrong role from differences found (1)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from tests.support.cluster import SERVER
from tests.support.databases import runtime_url
from tests.support.postgres import PostgresServer, quote_identifier

COMMAND = [SERVER, "projections", "rebuild"]
ROLE_REFUSED = 4


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
