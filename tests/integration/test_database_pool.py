"""The pool of fresh databases the tests take: cloned ahead, each handed out once, and
every one dropped, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from tests.support.database_pool import POOL_SIZE, DatabasePool
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.waiting import wait_until


@pytest_asyncio.fixture(loop_scope="session")
async def template(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A small template with one row the clones must have."""
    name = unique_database_name("llmgw_pool_template")
    await postgres_server.create_database(name)
    connection = await asyncpg.connect(postgres_server.url(name))
    try:
        await connection.execute("CREATE TABLE marker (word text); INSERT INTO marker VALUES ('x')")
    finally:
        await connection.close()
    yield name
    await postgres_server.drop_database(name)


@pytest.fixture
def prefix() -> str:
    """The names of one test's pool, told apart from every other database on the server."""
    return unique_database_name("llmgw_pooltest")


async def databases_named(server: PostgresServer, prefix: str) -> set[str]:
    connection = await asyncpg.connect(server.admin_url)
    try:
        rows = await connection.fetch(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", prefix
        )
    finally:
        await connection.close()
    return {row["datname"] for row in rows}


async def marker_of(server: PostgresServer, database: str) -> str:
    connection = await asyncpg.connect(server.url(database))
    try:
        return str(await connection.fetchval("SELECT word FROM marker"))
    finally:
        await connection.close()


async def test_databases_are_cloned_before_a_test_asks_for_one(
    postgres_server: PostgresServer, template: str, prefix: str
) -> None:
    pool = DatabasePool(postgres_server, template, size=2, prefix=prefix)
    pool.start()
    try:
        await wait_until(lambda: pool.ready == 2, what="two databases cloned ahead")
        cloned = await databases_named(postgres_server, prefix)
        assert len(cloned) == 2

        taken = await pool.take()

        assert taken in cloned
        assert await marker_of(postgres_server, taken) == "x"
        pool.give_back(taken)
    finally:
        await pool.close()


async def test_no_database_is_handed_out_twice(
    postgres_server: PostgresServer, template: str, prefix: str
) -> None:
    pool = DatabasePool(postgres_server, template, size=2, prefix=prefix)
    pool.start()
    try:
        taken = [await pool.take() for _ in range(5)]

        assert len(set(taken)) == 5
        for name in taken:
            pool.give_back(name)
    finally:
        await pool.close()


async def test_a_database_given_back_is_dropped_without_waiting_for_the_end(
    postgres_server: PostgresServer, template: str, prefix: str
) -> None:
    pool = DatabasePool(postgres_server, template, size=1, prefix=prefix)
    pool.start()
    try:
        taken = await pool.take()

        pool.give_back(taken)

        async def dropped() -> bool:
            return taken not in await databases_named(postgres_server, prefix)

        await wait_until(dropped, what=f"{taken} dropped")
    finally:
        await pool.close()


async def test_closing_drops_every_database_taken_or_not(
    postgres_server: PostgresServer, template: str, prefix: str
) -> None:
    pool = DatabasePool(postgres_server, template, size=2, prefix=prefix)
    pool.start()
    given_back = await pool.take()
    kept = await pool.take()  # a test that never gave its database back
    pool.give_back(given_back)
    await wait_until(lambda: pool.ready == 2, what="the pool full again")
    assert kept in await databases_named(postgres_server, prefix)

    await pool.close()

    assert await databases_named(postgres_server, prefix) == set()


async def test_a_clone_that_fails_is_raised_to_the_test_that_takes_it(
    postgres_server: PostgresServer, prefix: str
) -> None:
    pool = DatabasePool(postgres_server, unique_database_name("llmgw_missing"), prefix=prefix)
    pool.start()

    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await pool.take()
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await pool.close()
    assert await databases_named(postgres_server, prefix) == set()


async def test_a_database_not_of_the_pool_is_refused_back(
    postgres_server: PostgresServer, template: str, prefix: str
) -> None:
    pool = DatabasePool(postgres_server, template, size=1, prefix=prefix)
    pool.start()
    try:
        with pytest.raises(ValueError, match="not a database of this pool"):
            pool.give_back(template)
        assert template in await databases_named(postgres_server, "llmgw_pool_template")
    finally:
        await pool.close()


def test_a_pool_keeps_at_least_one_database_ready(postgres_server: PostgresServer) -> None:
    with pytest.raises(ValueError, match="at least one"):
        DatabasePool(postgres_server, "any", size=0)


async def test_the_next_tests_database_is_ready_while_this_one_runs(
    database_pool: DatabasePool, database_url: str
) -> None:
    await wait_until(lambda: database_pool.ready == POOL_SIZE, what="the next databases cloned")


async def test_a_take_cancelled_as_its_clone_lands_leaves_the_database_ready(
    postgres_server: PostgresServer, template: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test cancelled (or timed out) while it waits in ``take()``, just as the clone it
    waits for lands, takes nothing: the clone stays ready for the next test, and the pool
    keeps its room to clone more (lost, a pool of one would hang every later test)."""
    pool = DatabasePool(postgres_server, template, size=1, prefix=prefix)
    loop = asyncio.get_running_loop()
    clone = postgres_server.create_database
    waiting: list[asyncio.Task[str]] = []

    async def clone_then_cancel_the_taker(name: str, template: str | None = None) -> None:
        await clone(name, template=template)
        if waiting:  # cancelled once the clone is handed over, before the taker resumes
            loop.call_soon(loop.call_soon, waiting[0].cancel)

    pool.start()
    try:
        first = await pool.take()  # the next clone starts now
        monkeypatch.setattr(postgres_server, "create_database", clone_then_cancel_the_taker)
        waiting.append(asyncio.create_task(pool.take()))
        with pytest.raises(asyncio.CancelledError):
            await waiting[0]
        monkeypatch.undo()

        await wait_until(lambda: pool.ready == 1, what="the clone left ready")
        second = await pool.take()
        assert second != first
        assert await marker_of(postgres_server, second) == "x"
        await wait_until(lambda: pool.ready == 1, what="the next one cloned")
    finally:
        await pool.close()
    assert await databases_named(postgres_server, prefix) == set()


async def take_or_none(pool: DatabasePool) -> str | None:
    try:
        return await pool.take()
    except asyncpg.InvalidCatalogNameError:
        return None


async def test_a_clone_that_fails_fails_only_the_test_that_takes_it(
    postgres_server: PostgresServer, prefix: str
) -> None:
    """A server short of room (or a template briefly held) fails one clone: the test that
    takes it fails, as when each test cloned its own, and the next test gets a clone
    made after it, not the same failure for the rest of the session."""
    template = unique_database_name("llmgw_pool_late_template")
    pool = DatabasePool(postgres_server, template, size=1, prefix=prefix)
    pool.start()
    try:
        with pytest.raises(asyncpg.InvalidCatalogNameError):
            await pool.take()
        await postgres_server.create_database(template)

        # The clone tried while the test above failed may have been under way before the
        # template was made: the one after it is not.
        taken = [name for name in [await take_or_none(pool), await take_or_none(pool)] if name]

        assert taken, "no clone after the template was made"
        assert taken[0].startswith(prefix)
        for name in taken:
            pool.give_back(name)
    finally:
        with pytest.raises(asyncpg.InvalidCatalogNameError):  # said again at the end
            await pool.close()
        await postgres_server.drop_database(template)
    assert await databases_named(postgres_server, prefix) == set()


async def set_template(server: PostgresServer, database: str, is_template: bool) -> None:
    connection = await asyncpg.connect(server.admin_url)
    try:
        await connection.execute(
            f'ALTER DATABASE "{database}" WITH IS_TEMPLATE {str(is_template).lower()}'
        )
    finally:
        await connection.close()


async def test_a_drop_that_fails_fails_only_the_teardown_that_comes_to_it(
    postgres_server: PostgresServer, template: str, prefix: str
) -> None:
    """A database that cannot be dropped (PostgreSQL refuses to drop a template) fails one
    teardown, the next, as when each test dropped its own; the databases given back
    around it are dropped, and it is tried again at the end."""
    pool = DatabasePool(postgres_server, template, size=2, prefix=prefix)
    pool.start()
    try:
        stuck, other = await pool.take(), await pool.take()
        await set_template(postgres_server, stuck, True)
        pool.give_back(stuck)
        pool.give_back(other)

        async def dropped(name: str) -> bool:
            return name not in await databases_named(postgres_server, prefix)

        await wait_until(lambda: dropped(other), what="the database given back after it dropped")

        third = await pool.take()
        with pytest.raises(asyncpg.WrongObjectTypeError):
            pool.give_back(third)  # the teardown that comes next is told of it
        await wait_until(lambda: dropped(third), what="the database of that teardown dropped")
        pool.give_back(await pool.take())  # told once: the next teardown goes through
        assert not await dropped(stuck)
    finally:
        await set_template(postgres_server, stuck, False)
        with pytest.raises(asyncpg.WrongObjectTypeError):  # said again at the end
            await pool.close()
    assert await databases_named(postgres_server, prefix) == set()
