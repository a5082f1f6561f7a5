"""The schema check reads what Alembic writes without loading Alembic (``app.store.schema``):
the revisions of the migration scripts from their literal assignments, and the revision a
database is at from ``alembic_version``. Each reading is held here to Alembic's own, on the
packaged migrations, on a copy with a later release's migration added, and on real
databases; a script it cannot read so is refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import create_engine
from app.store.schema import (
    MigrationsUnreadable,
    current_revision,
    migrations_dir,
    release_revisions,
)
from tests.support.postgres import PostgresServer, unique_database_name

LATER_MIGRATION = '''"""A later release's table"""

from alembic import op

revision: str = "9001"
down_revision: str | None = "{head}"


def upgrade() -> None:
    op.execute("CREATE TABLE later_things (id int PRIMARY KEY)")
'''


def alembics_reading(directory: Path) -> tuple[str | None, frozenset[str]]:
    script = ScriptDirectory(str(directory))
    return script.get_current_head(), frozenset(each.revision for each in script.walk_revisions())


@pytest.fixture
def copied_migrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the packaged migrations, which ``LLMGW_MIGRATIONS_DIR`` names."""
    monkeypatch.delenv("LLMGW_MIGRATIONS_DIR", raising=False)
    copy = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("LLMGW_MIGRATIONS_DIR", str(copy))
    return copy


def test_the_release_revisions_are_the_ones_alembic_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LLMGW_MIGRATIONS_DIR", raising=False)

    release = release_revisions()

    assert (release.head, release.known) == alembics_reading(migrations_dir())
    assert len(release.known) >= 20


def test_a_later_releases_migration_is_the_head_for_both(copied_migrations: Path) -> None:
    head = release_revisions().head
    later = copied_migrations / "versions" / "9001_later_things.py"
    later.write_text(LATER_MIGRATION.format(head=head))

    release = release_revisions()

    assert release.head == "9001"
    assert (release.head, release.known) == alembics_reading(copied_migrations)


def test_a_script_whose_revision_is_not_a_literal_is_refused_by_name(
    copied_migrations: Path,
) -> None:
    computed = copied_migrations / "versions" / "9001_computed.py"
    head = release_revisions().head
    computed.write_text(f'revision = "90" + "01"\ndown_revision = "{head}"\n')

    with pytest.raises(MigrationsUnreadable) as refused:
        release_revisions()

    assert str(refused.value) == (
        f"the migration {computed} does not assign its revision and down_revision as "
        "string literals"
    )


def test_scripts_with_two_heads_are_refused(copied_migrations: Path) -> None:
    head = release_revisions().head
    for name in ("9001", "9002"):
        script = copied_migrations / "versions" / f"{name}_branch.py"
        script.write_text(f'revision = "{name}"\ndown_revision = "{head}"\n')

    with pytest.raises(MigrationsUnreadable) as refused:
        release_revisions()

    assert str(refused.value) == (
        f"the migrations in {copied_migrations} have 2 heads (9001, 9002): a release has one"
    )


async def alembics_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )


async def test_a_migrated_database_is_at_the_revision_alembic_reads(
    engine: AsyncEngine,
) -> None:
    revision = await current_revision(engine)

    assert revision == await alembics_revision(engine)
    assert revision == release_revisions().head


async def test_a_database_never_migrated_is_at_none_for_both(
    postgres_server: PostgresServer,
) -> None:
    name = unique_database_name("llmgw_unmigrated")
    await postgres_server.create_database(name)
    engine = create_engine(postgres_server.url(name))
    try:
        assert await current_revision(engine) is None
        assert await alembics_revision(engine) is None
    finally:
        await engine.dispose()
        await postgres_server.drop_database(name)
