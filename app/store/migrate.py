"""Running the Alembic migrations from code (``llmgw-server migrate``, tests, the dev cluster)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import sqlalchemy_url
from app.store.errors import StoreError

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


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url``. Blocking: call it outside a running event loop
    (or through ``asyncio.to_thread``)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory(str(migrations_dir())).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )
