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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import (
    create_engine,
    sqlalchemy_url,
    translated_blocking_errors,
    translated_errors,
    waiting_engine,
)
from app.store.grants import (
    RuntimeRole,
    check_roles,
    ensure_runtime_role,
    grant_gateway_privileges,
    grant_runtime_privileges,
)
from app.store.schema import migrations_dir, release_revisions

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
    return release_revisions().head


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
