"""``log verify``, ``log head``, ``projections rebuild`` and ``migrate`` against a database
that stops answering, run as an operator's script runs them: each gives up on one statement
after ``--answer-timeout`` and says in one line what it waited for, with its exit code,
instead of hanging until someone presses Ctrl-C.

The database stops answering three ways: the network to it is cut once a chosen statement
is sent (``tests.support.tcp_relay`` holds the connection: a partition), a session holds a
lock the command needs, or nothing answers from the start (the relay cut before the
command connects)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from app.store.database_url import parse_database_url
from tests.support.cluster import SERVER
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.tcp_relay import Break, TcpRelay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

ANSWER_TIMEOUT_S = 1.0
GIVES_UP_WITHIN_S = 20.0
"""From the command's start: the answer timeout, a Python start-up and an engine's
disposal with room to spare on a loaded machine; a command that hangs is killed then."""


async def run_server(*args: str) -> tuple[int, str, str]:
    """``llmgw-server ARGS --answer-timeout 1``: its exit code, stdout and stderr; fails the
    test, killing it, when it has not ended within ``GIVES_UP_WITHIN_S``."""
    process = await asyncio.create_subprocess_exec(
        SERVER,
        *args,
        "--answer-timeout",
        f"{ANSWER_TIMEOUT_S:g}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(GIVES_UP_WITHIN_S):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(
            f"llmgw-server {' '.join(args[:2])} still waits after {GIVES_UP_WITHIN_S} s"
        ) from None
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def until_its_sessions_end(database_url: str) -> None:
    """Once the relay mends, PostgreSQL reads the end of the cut-off command's connection and
    ends its session, undoing its transaction and letting go of its locks."""
    conn = await asyncpg.connect(database_url)
    try:

        async def none_left() -> bool:
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return bool(others == 0)

        await wait_until(none_left, what="the cut-off session ended")
    finally:
        await conn.close()


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


async def test_log_verify_cut_off_mid_walk_gives_up_saying_nothing_is_known(
    database_url: str, relay: TcpRelay
) -> None:
    relay.break_after_sending(b"max(position)", Break.HOLD)

    status, stdout, stderr = await run_server(
        "log", "verify", "--database-url", relay.in_front_of(database_url)
    )

    assert (status, stdout) == (3, ""), stderr
    assert one_line(stderr) == (
        "llmgw-server log verify: cannot verify the log: the database gave no answer for 1 s "
        "(--answer-timeout): the network to it is cut off, its host is frozen, or it is "
        "stalled; nothing was changed (it only reads), and nothing is known of the log"
    )


async def test_log_head_of_a_database_that_never_answers_gives_up(
    database_url: str, relay: TcpRelay
) -> None:
    relay.cut()

    status, stdout, stderr = await run_server(
        "log", "head", "--database-url", relay.in_front_of(database_url)
    )

    assert (status, stdout) == (3, ""), stderr
    assert "cannot read the head of the log: the database gave no answer for 1 s" in one_line(
        stderr
    )


async def test_log_verify_behind_a_lock_names_the_lock_and_where_to_look(
    database_url: str,
) -> None:
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        status, stdout, stderr = await run_server("log", "verify", "--database-url", database_url)
    finally:
        await holder.close()

    assert (status, stdout) == (3, ""), stderr
    line = one_line(stderr)
    assert line.startswith(
        "llmgw-server log verify: cannot verify the log: a statement waited 0.8 s for a lock "
        "another session holds, and PostgreSQL gave it up (lock_timeout); pg_stat_activity "
        "shows the session holding it"
    ), line
    assert line.endswith("nothing was changed (it only reads), and nothing is known of the log")


async def _projection_rows(database_url: str) -> tuple[int, int]:
    conn = await asyncpg.connect(database_url)
    try:
        models = await conn.fetchval("SELECT count(*) FROM models")
        position = await conn.fetchval("SELECT position FROM projection_checkpoints")
        return int(models), int(position)
    finally:
        await conn.close()


async def test_a_rebuild_cut_off_after_emptying_the_tables_leaves_them_as_they_were(
    database_url: str, relay: TcpRelay
) -> None:
    before = await _projection_rows(database_url)
    relay.break_after_sending(b"TRUNCATE", Break.HOLD)

    status, stdout, stderr = await run_server(
        "projections", "rebuild", "--database-url", relay.in_front_of(database_url)
    )

    assert (status, stdout) == (3, ""), stderr
    assert one_line(stderr) == (
        "llmgw-server projections rebuild: cannot rebuild the projections: the database gave "
        "no answer for 1 s (--answer-timeout): the network to it is cut off, its host is "
        "frozen, or it is stalled; nothing was changed: the rebuild is one transaction, never "
        "committed"
    )
    # The network mends: PostgreSQL finds the client gone and undoes the transaction.
    relay.mend()
    await until_its_sessions_end(database_url)
    status, stdout, stderr = await run_server(
        "projections", "rebuild", "--verify", "--database-url", database_url
    )
    assert (status, stdout.splitlines()[-1]) == (0, "no differences"), stderr
    assert await _projection_rows(database_url) == before


async def test_a_rebuild_whose_commit_gets_no_answer_says_it_may_have_committed(
    database_url: str, relay: TcpRelay
) -> None:
    relay.break_after_sending(b"COMMIT", Break.HOLD)

    status, stdout, stderr = await run_server(
        "projections", "rebuild", "--database-url", relay.in_front_of(database_url)
    )

    assert (status, stdout) == (3, ""), stderr
    assert one_line(stderr).endswith(
        "the rebuild is one transaction and its COMMIT got no answer: the tables are either "
        "as they were or wholly rebuilt; `llmgw-server projections rebuild --verify` tells"
    )
    relay.mend()
    await until_its_sessions_end(database_url)
    status, stdout, stderr = await run_server(
        "projections", "rebuild", "--verify", "--database-url", database_url
    )
    assert (status, stdout.splitlines()[-1]) == (0, "no differences"), stderr


async def test_a_rebuild_verify_behind_a_lock_names_the_lock(database_url: str) -> None:
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("BEGIN; LOCK TABLE models IN ACCESS EXCLUSIVE MODE")
        status, stdout, stderr = await run_server(
            "projections", "rebuild", "--verify", "--database-url", database_url
        )
    finally:
        await holder.close()

    assert (status, stdout) == (3, ""), stderr
    assert "waited 0.8 s for a lock another session holds" in one_line(stderr)


@pytest_asyncio.fixture(loop_scope="session")
async def empty_database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = unique_database_name("llmgw_unanswered")
    await postgres_server.create_database(name)
    yield postgres_server.url(name)
    await postgres_server.drop_database(name)


async def test_migrate_cut_off_says_running_it_again_is_safe_and_it_is(
    empty_database: str, postgres_server: PostgresServer
) -> None:
    (host, port), *_ = parse_database_url(empty_database).hosts
    assert port is not None
    async with TcpRelay(host, port) as relay:
        relay.break_after_sending(b"CREATE TABLE", Break.HOLD)
        started = time.monotonic()
        status, stdout, stderr = await run_server(
            "migrate", "--database-url", relay.in_front_of(empty_database)
        )
        assert (status, stdout) == (1, ""), stderr
        assert one_line(stderr) == (
            "llmgw-server migrate: cannot migrate: the database gave no answer for 1 s "
            "(--answer-timeout): the network to it is cut off, its host is frozen, or it is "
            "stalled; running migrate again is safe: each of its steps (the roles, the "
            "revisions, the grants) is one transaction, which the database undoes when its "
            "connection ends, and a step already done is found done"
        )
        assert time.monotonic() - started < GIVES_UP_WITHIN_S

        # The cut-off session still holds the migrate lock: a second run waits for it and
        # says so, rather than hanging.
        status, stdout, stderr = await run_server("migrate", "--database-url", empty_database)
        assert (status, stdout) == (1, ""), stderr
        assert "waited 0.8 s for a lock another session holds" in one_line(stderr)
        assert "running migrate again is safe" in stderr

        relay.mend()
        await until_its_sessions_end(empty_database)

        status, stdout, stderr = await run_server("migrate", "--database-url", empty_database)
        assert status == 0, stderr
        assert stdout.startswith("database at revision "), stdout


@pytest.mark.parametrize("how", [Break.RESET, Break.LOST])
@pytest.mark.parametrize(
    ("command", "marker", "line"),
    [
        (
            ("log", "verify"),
            b"max(position)",
            "llmgw-server log verify: cannot verify the log: database unreachable: "
            "connection was closed in the middle of operation",
        ),
        (
            ("projections", "rebuild"),
            b"TRUNCATE",
            "llmgw-server projections rebuild: cannot rebuild the projections: database "
            "unreachable: connection was closed in the middle of operation; nothing was "
            "changed: the rebuild is one transaction, never committed",
        ),
    ],
)
async def test_a_connection_reset_mid_work_is_named_not_the_rollback_after_it(
    database_url: str,
    relay: TcpRelay,
    how: Break,
    command: tuple[str, ...],
    marker: bytes,
    line: str,
) -> None:
    """Closing a connection that broke used to send it a ROLLBACK, whose own error (``cannot
    call Transaction.rollback(): the underlying connection is closed``) took the place of
    what broke."""
    relay.break_after_sending(marker, how)

    status, stdout, stderr = await run_server(
        *command, "--database-url", relay.in_front_of(database_url)
    )

    assert (status, stdout) == (3, ""), stderr
    assert one_line(stderr) == line
