"""The PostgreSQL the suite runs against: whichever server was chosen, and the local
cluster that ``devcluster.postgres`` runs for tests and development."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from devcluster.errors import DevDatabaseError
from devcluster.postgres import LocalPostgres, find_bindir
from tests.support.postgres import (
    LocalServer,
    PostgresServer,
    Unsupported,
    UrlServer,
    unique_database_name,
)


@pytest.fixture
async def database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = unique_database_name()
    await postgres_server.create_database(name)
    yield name
    await postgres_server.drop_database(name)


@pytest.fixture
def local_binaries() -> None:
    try:
        find_bindir()
    except DevDatabaseError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def own_local_server(local_binaries: None) -> Iterator[LocalServer]:
    """A cluster of the test's own, so that stopping it disturbs nobody else."""
    with LocalPostgres(durable=False) as cluster:
        yield LocalServer(cluster)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: as root that sits below a directory only root may enter.
    path = Path(tempfile.mkdtemp(prefix="llmgw-pg-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def fetch_value(url: str, query: str) -> object:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetchval(query)
    finally:
        await connection.close()


async def test_the_chosen_server_accepts_asyncpg_connections(
    postgres_server: PostgresServer, database: str
) -> None:
    assert await fetch_value(postgres_server.admin_url, "SELECT current_database()") == "postgres"
    assert await fetch_value(postgres_server.url(database), "SELECT current_database()") == database
    engine = create_async_engine(postgres_server.sqlalchemy_url(database))
    try:
        async with engine.connect() as connection:
            assert await connection.scalar(text("SELECT current_database()")) == database
    finally:
        await engine.dispose()


async def test_a_database_created_from_a_template_has_its_tables_and_rows(
    postgres_server: PostgresServer, database: str
) -> None:
    connection = await asyncpg.connect(postgres_server.url(database))
    await connection.execute("CREATE TABLE nodes (id text PRIMARY KEY)")
    await connection.execute("INSERT INTO nodes VALUES ('gpu-7')")
    await connection.close()

    copy = unique_database_name("copy")
    await postgres_server.create_database(copy, template=database)
    try:
        assert await fetch_value(postgres_server.url(copy), "SELECT id FROM nodes") == "gpu-7"
    finally:
        await postgres_server.drop_database(copy)


async def test_dropping_a_database_ends_the_sessions_still_connected(
    postgres_server: PostgresServer,
) -> None:
    name = unique_database_name()
    await postgres_server.create_database(name)
    connection = await asyncpg.connect(postgres_server.url(name))
    try:
        await postgres_server.drop_database(name)

        exists_query = f"SELECT count(*) FROM pg_database WHERE datname = '{name}'"
        assert await fetch_value(postgres_server.admin_url, exists_query) == 0
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
            await connection.fetchval("SELECT 1")
    finally:
        connection.terminate()


async def test_a_server_given_by_url_serves_databases_but_cannot_be_restarted(
    postgres_server: PostgresServer,
) -> None:
    external = UrlServer(postgres_server.admin_url, description="a server given by URL")
    name = unique_database_name()
    await external.create_database(name)
    try:
        assert await fetch_value(external.url(name), "SELECT current_database()") == name
    finally:
        await external.drop_database(name)

    with pytest.raises(Unsupported):
        await external.restart()


async def test_a_restarted_local_cluster_keeps_its_data_and_its_url(
    own_local_server: LocalServer,
) -> None:
    name = unique_database_name()
    await own_local_server.create_database(name)
    url = own_local_server.url(name)
    connection = await asyncpg.connect(url)
    await connection.execute("CREATE TABLE models (name text); INSERT INTO models VALUES ('llama')")
    await connection.close()

    await own_local_server.restart()

    assert own_local_server.url(name) == url
    assert await fetch_value(url, "SELECT name FROM models") == "llama"


async def test_a_stopped_local_cluster_refuses_connections_until_started(
    own_local_server: LocalServer,
) -> None:
    await own_local_server.stop()
    with pytest.raises(ConnectionRefusedError):
        await asyncpg.connect(own_local_server.admin_url)

    await own_local_server.start()
    assert await fetch_value(own_local_server.admin_url, "SELECT 1") == 1


def test_a_persistent_cluster_is_reused_with_its_port(
    local_binaries: None, state_dir: Path
) -> None:
    with LocalPostgres(state_dir, durable=False) as first:
        first_url = first.url()
    cluster_identity = _system_identifier(state_dir)

    with LocalPostgres(state_dir, durable=False) as second:
        assert second.url() == first_url
    assert _system_identifier(state_dir) == cluster_identity


def test_a_throwaway_cluster_leaves_nothing_behind(local_binaries: None) -> None:
    with LocalPostgres(durable=False) as cluster:
        state_dir = cluster.state_dir
        assert state_dir is not None
        assert cluster.is_running()

    assert not state_dir.exists()
    assert not cluster.is_running()


def test_a_cluster_that_cannot_start_says_why_from_its_log(
    local_binaries: None, state_dir: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as occupier:
        taken_port = occupier.getsockname()[1]
        cluster = LocalPostgres(state_dir, durable=False, port=taken_port)
        try:
            with pytest.raises(DevDatabaseError, match="Address already in use"):
                cluster.start()
        finally:
            cluster.close()


def test_missing_binaries_are_reported_with_how_to_install_them(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    monkeypatch.setenv("LLMGW_PG_BINDIR", str(state_dir))
    with pytest.raises(DevDatabaseError, match=r"apt-get install postgresql"):
        LocalPostgres(durable=False).start()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the cluster to another user")
def test_a_state_dir_the_postgres_user_cannot_reach_is_refused(
    local_binaries: None, state_dir: Path
) -> None:
    state_dir.chmod(0o700)
    with pytest.raises(DevDatabaseError, match="traversable"):
        LocalPostgres(state_dir / "cluster", durable=False).start()


def _system_identifier(state_dir: Path) -> str:
    """The number initdb draws for each new cluster: the first field of pg_control."""
    return (state_dir / "data" / "global" / "pg_control").read_bytes()[:8].hex()
