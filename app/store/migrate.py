"""Running the Alembic migrations from code (``llmgw-server migrate``, tests, the dev cluster).

``upgrade`` with a ``RuntimeRole`` also creates that role (or sets its password) before the
migrations run, and after them grants the runtime privileges (``app.store.grants``) to it and
to every role that holds them already; likewise for a gateway role and the gateway
privileges.

Every step's transaction (the role, the revisions, the grants) first takes
``MIGRATE_LOCK_KEY``, so two ``migrate`` runs at once take turns instead of both applying
the same revision.
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, assert_never

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import (
    create_engine,
    sqlalchemy_url,
    translated_blocking_errors,
    translated_errors,
    waiting_engine,
)
from app.store.errors import StoreError
from app.store.grants import (
    RuntimeRole,
    check_roles,
    ensure_runtime_role,
    grant_gateway_privileges,
    grant_runtime_privileges,
)

T = TypeVar("T")

MIGRATE_LOCK_KEY = 0x6C6C6D67_77000004  # "llmgw" + 4 (+ 1 append, + 2 leader, + 3 snapshots)
"""Why a lock: Alembic reads the revision a database is at and then applies what follows it,
with nothing to stop a second run from reading the same revision meanwhile. Two runs at once
(each host's unit migrating before it serves, two deploy pipelines) both applied the next
revision, and the second failed with a traceback (``column "expires_at" of relation
"api_keys" already exists``). Taken for a transaction, it is let go at its commit or
rollback, and by a run killed half-way."""


def take_migrate_lock(connection: Connection) -> None:
    """Wait for any other ``migrate`` step to end, in ``connection``'s transaction."""
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK_KEY})


PACKAGED_MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"
"""``app/migrations``, installed with the package."""


class MigrationsNotFound(StoreError):
    pass


def migrations_dir() -> Path:
    """The packaged migrations, or the directory ``LLMGW_MIGRATIONS_DIR`` names instead."""
    configured = os.environ.get("LLMGW_MIGRATIONS_DIR")
    directory = Path(configured) if configured else PACKAGED_MIGRATIONS
    source = " (LLMGW_MIGRATIONS_DIR)" if configured else ""
    if not directory.is_dir():
        raise MigrationsNotFound(f"the migrations directory {directory}{source} does not exist")
    if not (directory / "env.py").is_file():
        raise MigrationsNotFound(
            f"the migrations directory {directory}{source} holds no Alembic env.py"
        )
    return directory


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


@dataclass(frozen=True)
class Upgraded:
    runtime_roles: list[str]
    """The roles that hold the runtime privileges now (none below the newest revision)."""
    created_role: bool = False
    """Whether the runtime role asked for was created (rather than found)."""
    gateway_roles: list[str] = field(default_factory=list)
    """The roles that hold the gateway privileges now (none below the newest revision)."""
    created_gateway_role: bool = False


def upgrade(
    url: str,
    revision: str = "head",
    runtime: RuntimeRole | None = None,
    gateway: RuntimeRole | None = None,
    answer_timeout_s: float | None = None,
) -> Upgraded:
    """Upgrade the database at ``url``; at the newest revision, (re-)grant the runtime
    privileges to ``runtime`` and the gateway privileges to ``gateway`` (each created first
    if missing) and to every role that holds them already. Raises ``StoreError`` when the
    database cannot be reached or refuses (a password, a database that does not exist, a
    privilege). With ``answer_timeout_s``, every statement of every step waits at most that
    long for an answer (``waiting_engine``). Blocking: call it outside a running event loop
    (or through ``asyncio.to_thread``)."""
    check_roles(runtime, gateway)
    config = alembic_config(url)
    config.attributes["answer_timeout_s"] = answer_timeout_s
    created = created_gateway = False
    if runtime is not None:
        created = _run(
            url, lambda connection: ensure_runtime_role(connection, runtime), answer_timeout_s
        )
        config.attributes["runtime_role"] = runtime.name
    if gateway is not None:
        created_gateway = _run(
            url, lambda connection: ensure_runtime_role(connection, gateway), answer_timeout_s
        )
    with translated_blocking_errors():
        command.upgrade(config, revision)
    if revision != "head":
        return Upgraded([], created, [], created_gateway)
    name = runtime.name if runtime is not None else None
    roles = _run(
        url, lambda connection: grant_runtime_privileges(connection, name), answer_timeout_s
    )
    gateway_name = gateway.name if gateway is not None else None
    gateways = _run(
        url,
        lambda connection: grant_gateway_privileges(connection, gateway_name),
        answer_timeout_s,
    )
    return Upgraded(roles, created, gateways, created_gateway)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory(str(migrations_dir())).get_current_head()


class SchemaStanding(enum.Enum):
    """Where a database's schema stands against this release's migrations."""

    CURRENT = "current"
    """At this release's newest revision."""
    MISSING = "missing"
    """Not migrated: no llmgw schema in it."""
    OLDER = "older"
    """At a revision this release knows, below its newest: ``migrate`` brings it up."""
    NEWER = "newer"
    """At a revision this release does not know: a newer release migrated it, and
    ``migrate`` of this one cannot take it back."""


@dataclass(frozen=True)
class ReleaseRevisions:
    """The revisions this release's migration scripts know (``release_revisions()``)."""

    head: str | None
    known: frozenset[str]

    def standing(self, revision: str | None) -> SchemaStanding:
        """Where a schema at ``revision`` (None: no schema) stands."""
        if revision == self.head:
            return SchemaStanding.CURRENT
        if revision is None:
            return SchemaStanding.MISSING
        if revision in self.known:
            return SchemaStanding.OLDER
        return SchemaStanding.NEWER

    def refusal(self, revision: str | None, *, newer_allowed: bool = False) -> str | None:
        """Why a server of this release must not run on a schema at ``revision``, in words
        for the operator; None at this release's newest revision, and at one it does not
        know when ``newer_allowed`` (a gateway: it goes on serving while a newer release is
        rolled out)."""
        head = self.head
        match self.standing(revision):
            case SchemaStanding.CURRENT:
                return None
            case SchemaStanding.MISSING:
                return (
                    "the database is not migrated (no llmgw schema in it); run `llmgw-server "
                    "migrate` of this release first, as the schema's owner, to bring it to "
                    f"revision {head}"
                )
            case SchemaStanding.OLDER:
                return (
                    f"the database schema is at revision {revision}, this release needs "
                    f"{head}; run `llmgw-server migrate` of this release first, as the "
                    "schema's owner (docs/operations.md#upgrades)"
                )
            case SchemaStanding.NEWER:
                if newer_allowed:
                    return None
                return (
                    f"the database schema is at revision {revision}, which this release does "
                    f"not know (its newest is {head}): a newer llmgw release migrated it; run "
                    "that release"
                )
            case unreachable:
                assert_never(unreachable)


def release_revisions() -> ReleaseRevisions:
    """Reads the migration scripts: blocking, and seconds on a cold start, so a server reads
    them once, off its event loop."""
    script = ScriptDirectory(str(migrations_dir()))
    known = frozenset(each.revision for each in script.walk_revisions())
    return ReleaseRevisions(script.get_current_head(), known)


def schema_refusal(revision: str | None, *, newer_allowed: bool = False) -> str | None:
    """``ReleaseRevisions.refusal`` after reading the migration scripts (blocking)."""
    return release_revisions().refusal(revision, newer_allowed=newer_allowed)


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )


INSUFFICIENT_PRIVILEGE = "42501"
"""PostgreSQL's SQLSTATE for a statement the role may not run."""


async def schema_revision(engine: AsyncEngine) -> str | None:
    """The revision the database's schema is at (None: not migrated). Raises ``StoreError``
    when it cannot be asked, saying how to grant the runtime privileges to a role that may
    not read it (a runtime role set up for one database and pointed at another: privileges
    belong to one database)."""
    try:
        async with translated_errors():
            return await current_revision(engine)
    except StoreError as exc:
        if (
            getattr(getattr(exc.__cause__, "orig", None), "sqlstate", None)
            == INSUFFICIENT_PRIVILEGE
        ):
            raise StoreError(
                f"{exc}: the role lacks the runtime privileges in this database; as the "
                "schema's owner, grant them with `llmgw-server migrate --runtime-role ROLE` "
                "(docs/security.md)"
            ) from exc
        raise


def migration_engine(url: str, answer_timeout_s: float | None) -> AsyncEngine:
    """The one connection a step of ``upgrade`` runs on (Alembic's ``env.py`` too)."""
    if answer_timeout_s is None:
        return create_engine(url, pool_size=1)
    return waiting_engine(url, answer_timeout_s)


def _run(url: str, work: Callable[[Connection], T], answer_timeout_s: float | None) -> T:
    """``work`` on a synchronous connection to ``url``, in one transaction that holds the
    migrate lock."""

    def locked(connection: Connection) -> T:
        take_migrate_lock(connection)
        return work(connection)

    async def run() -> T:
        engine = migration_engine(url, answer_timeout_s)
        try:
            async with translated_errors(), engine.begin() as conn:
                return await conn.run_sync(locked)
        finally:
            await engine.dispose()

    return asyncio.run(run())
