"""The dev cluster's database, with the two roles of production.

PostgreSQL is ``LLMGW_DATABASE_URL`` when set, else a cluster kept in the state directory
(``devcluster.postgres``), else a container when a Docker daemon answers
(``devcluster.docker``). ``llmgw-server migrate`` runs as that server's superuser (or the
role of ``LLMGW_DATABASE_URL``), which owns the schema, and sets up ``llmgw_runtime`` with
a password generated once into the state directory; ``serve`` connects as that role.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

from devcluster.docker import DockerPostgres, docker_answers
from devcluster.errors import DevDatabaseError, DevError
from devcluster.postgres import LocalPostgres, find_bindir
from devcluster.processes import program, run
from devcluster.state_files import read_state_file

DATABASE = "llmgw"
RUNTIME_ROLE = "llmgw_runtime"
MIGRATE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class PreparedDatabase:
    runtime_url: str
    """What ``serve`` connects with: the runtime role's URL (it holds a password)."""
    postgres: LocalPostgres | DockerPostgres | None
    """The PostgreSQL started here, to stop at the end; None for ``LLMGW_DATABASE_URL``."""
    owner_url: str | None
    """The started PostgreSQL's superuser URL, for ``llmgw-server log verify`` and ``psql``
    (trusted on 127.0.0.1: it holds no password); None for ``LLMGW_DATABASE_URL``, whose
    URL may hold one and is the operator's own."""


def prepare_database(state_dir: Path, configured_url: str | None) -> PreparedDatabase:
    """Start PostgreSQL unless ``configured_url`` names one, create the database, migrate
    it and set up the runtime role. A PostgreSQL started here is stopped again if a later
    step fails."""
    postgres: LocalPostgres | DockerPostgres | None = None
    try:
        url = configured_url
        if url is None:
            postgres = local_or_docker_postgres(state_dir)
            postgres.start()
            asyncio.run(_create_database(postgres.url(), DATABASE))
            url = postgres.url(DATABASE)
        password_file = state_dir / "runtime-password"
        password = secret(password_file)
        _migrate(url, password_file)
    except BaseException:
        if postgres is not None:
            postgres.stop()
        raise
    as_runtime = make_url(url).set(username=RUNTIME_ROLE, password=password)
    owner_url = None if postgres is None else url
    return PreparedDatabase(as_runtime.render_as_string(hide_password=False), postgres, owner_url)


def local_or_docker_postgres(state_dir: Path) -> LocalPostgres | DockerPostgres:
    """The local PostgreSQL binaries when installed, else a container when Docker answers
    (each kept in the state directory, so the next run finds the same log)."""
    try:
        find_bindir()
    except DevDatabaseError as exc:
        if docker_answers():
            return DockerPostgres(state_dir / "postgres-docker")
        raise DevDatabaseError(f"{exc}; and no Docker daemon answers either") from exc
    return LocalPostgres(state_dir / "postgres", durable=True)


def secret(path: Path) -> str:
    """The secret stored at ``path`` (mode 0600), generated the first time."""
    stored = read_state_file(path)
    if stored is None:
        stored = secrets.token_urlsafe(32)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(stored + "\n")
    return stored.strip()


def _migrate(owner_url: str, password_file: Path) -> None:
    argv = [program("llmgw-server"), "migrate", "--runtime-role", RUNTIME_ROLE]
    argv += ["--runtime-password-file", str(password_file)]
    done = run(argv, timeout_s=MIGRATE_TIMEOUT_S, settings={"LLMGW_DATABASE_URL": owner_url})
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()
        raise DevError(f"cannot prepare the database: {output}")


async def _create_database(admin_url: str, name: str) -> None:
    try:
        connection = await asyncpg.connect(admin_url)
    except (OSError, asyncpg.PostgresError) as exc:
        raise DevDatabaseError(f"cannot connect to {admin_url}: {exc}") from exc
    try:
        if not await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
