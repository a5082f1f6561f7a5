"""The PostgreSQL server a test session runs against, and its databases.

``provide_postgres()`` picks the first that is available:

1. ``LLMGW_TEST_DATABASE_URL``: an existing server (any database in the URL; tests create
   their own databases on it and a runtime role, so its role needs CREATEDB and CREATEROLE);
2. a ``postgres:15`` container, when a Docker daemon answers;
3. a throwaway cluster from the local PostgreSQL binaries (``devcluster.postgres.LocalPostgres``).

Only the local cluster can be stopped and restarted by a test; the others raise
``Unsupported``, which such a test turns into a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import asyncpg
from sqlalchemy.engine import make_url

from devcluster.postgres import LocalPostgres

if TYPE_CHECKING:
    from testcontainers.community.postgres import PostgresContainer

TEST_DATABASE_URL_ENV = "LLMGW_TEST_DATABASE_URL"
CONTAINER_IMAGE = "postgres:15"
DOCKER_PING_TIMEOUT_S = 2.0
TEST_SERVER_SETTINGS = (
    "-c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
)


class Unsupported(Exception):
    """This server cannot do that (an external server or a container cannot be restarted)."""


class PostgresServer(ABC):
    """A server the tests may create and drop databases on."""

    description: str

    @abstractmethod
    def url(self, database: str) -> str:
        """A ``postgresql://`` URL (asyncpg, libpq) for ``database`` on this server."""

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def sqlalchemy_url(self, database: str) -> str:
        url = make_url(self.url(database)).set(drivername="postgresql+asyncpg")
        return url.render_as_string(hide_password=False)

    async def create_database(self, name: str, template: str | None = None) -> None:
        """Create ``name``, as a copy of ``template`` when one is given (nobody may be
        connected to the template meanwhile)."""
        statement = f"CREATE DATABASE {quote_identifier(name)}"
        if template is not None:
            statement += f" TEMPLATE {quote_identifier(template)}"
        await self._execute_as_admin(statement)

    async def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, ending the sessions still connected to it."""
        await self._execute_as_admin(
            f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)"
        )

    async def stop(self) -> None:
        raise Unsupported(f"{self.description} cannot be stopped by the tests")

    async def start(self) -> None:
        raise Unsupported(f"{self.description} cannot be started by the tests")

    async def restart(self) -> None:
        raise Unsupported(f"{self.description} cannot be restarted by the tests")

    async def _execute_as_admin(self, statement: str) -> None:
        connection = await asyncpg.connect(self.admin_url)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()


class UrlServer(PostgresServer):
    """A server someone else runs: an external one or a container."""

    def __init__(self, server_url: str, description: str) -> None:
        self._server_url = make_url(server_url)
        self.description = description

    def url(self, database: str) -> str:
        url = self._server_url.set(drivername="postgresql", database=database)
        return url.render_as_string(hide_password=False)


class LocalServer(PostgresServer):
    """A cluster of this process's own, run from the local binaries."""

    def __init__(self, cluster: LocalPostgres) -> None:
        self._cluster = cluster
        self.description = "the local cluster"

    def url(self, database: str) -> str:
        return self._cluster.url(database)

    async def stop(self) -> None:
        await asyncio.to_thread(self._cluster.stop)

    async def start(self) -> None:
        await asyncio.to_thread(self._cluster.start)

    async def restart(self) -> None:
        await asyncio.to_thread(self._cluster.restart)


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def unique_database_name(prefix: str = "test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextmanager
def provide_postgres() -> Iterator[PostgresServer]:
    """The first available server (see the module docstring), stopped on exit."""
    external_url = os.environ.get(TEST_DATABASE_URL_ENV)
    if external_url:
        shown = make_url(external_url).render_as_string(hide_password=True)
        _announce(f"{TEST_DATABASE_URL_ENV} ({shown})")
        yield UrlServer(external_url, description=f"the server at {TEST_DATABASE_URL_ENV}")
        return
    container = _started_container() if docker_answers() else None
    if container is not None:
        try:
            url = container.get_connection_url()
            _announce(f"a {CONTAINER_IMAGE} container ({make_url(url).render_as_string()})")
            yield UrlServer(url, description=f"the {CONTAINER_IMAGE} container")
        finally:
            container.stop()
        return
    with LocalPostgres(durable=False) as cluster:
        _announce(f"a throwaway local cluster ({cluster.url()})")
        yield LocalServer(cluster)


def _started_container() -> PostgresContainer | None:
    from testcontainers.community.postgres import PostgresContainer

    container = PostgresContainer(CONTAINER_IMAGE, driver=None)
    container.with_command(f"postgres {TEST_SERVER_SETTINGS}")
    try:
        container.start()
    except Exception as exc:  # e.g. the image cannot be pulled: the local cluster will do
        with contextlib.suppress(Exception):
            container.stop()
        _announce(f"no {CONTAINER_IMAGE} container ({exc!r}), trying the local binaries")
        return None
    return container


def docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach a daemon means there is none to use
        return False


def _announce(choice: str) -> None:
    print(f"PostgreSQL for tests: {choice}", file=sys.stderr, flush=True)
