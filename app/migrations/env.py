"""Alembic environment: async, on the same engine settings as the server."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from app.store.migrate import migration_engine, take_migrate_lock
from app.store.tables import metadata

config = context.config
target_metadata = metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    url = url or os.environ.get("LLMGW_DATABASE_URL")
    if not url:
        raise SystemExit("no database URL: set LLMGW_DATABASE_URL or pass -x url=...")
    return url


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        # Before Alembic reads the revision the database is at: another run's revisions
        # are committed by then, and found applied (app.store.migrate.MIGRATE_LOCK_KEY).
        take_migrate_lock(connection)
        context.run_migrations()


async def _run_async() -> None:
    engine = migration_engine(_url(), config.attributes.get("answer_timeout_s"))
    async with engine.connect() as connection:
        await connection.run_sync(_run)
        await connection.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    existing = config.attributes.get("connection")
    if existing is not None:
        _run(existing)
    else:
        asyncio.run(_run_async())
