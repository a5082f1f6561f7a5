"""Where a database's schema stands against this release: the revisions of the release's
migration scripts, the one the database is at, and why a server of this release must not
run on it (``schema_refusal``). ``serve``, ``gateway``, ``log`` and ``projections`` check
this at every start and ``/readyz`` at every probe, so it reads what Alembic writes (the
scripts' revision names, the ``alembic_version`` table) without loading Alembic, which
``app.store.migrate`` runs.
"""

from __future__ import annotations

import ast
import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import translated_errors
from app.store.errors import StoreError

VERSION_TABLE = "alembic_version"
"""Where Alembic records the revision a database is at (its default name and schema)."""

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


class MigrationsUnreadable(StoreError):
    """A migration script whose revisions cannot be read without running it, or scripts
    with more than one head."""


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
    """The revisions of the migration scripts (blocking: it reads their files). Each script
    names its revision and the one it revises in literal assignments, which are read
    without running the script or loading Alembic (a fifth of a second of every server
    command's start); ``tests/integration/test_schema_revisions.py`` holds this reading to
    Alembic's own. Raises ``MigrationsUnreadable`` for a script it cannot read so."""
    revises: dict[str, str | None] = {}
    for script in sorted((migrations_dir() / "versions").glob("*.py")):
        revision, down_revision = _named_revisions(script)
        revises[revision] = down_revision
    revised = set(revises.values())
    heads = sorted(revision for revision in revises if revision not in revised)
    if len(heads) > 1:
        raise MigrationsUnreadable(
            f"the migrations in {migrations_dir()} have {len(heads)} heads "
            f"({', '.join(heads)}): a release has one"
        )
    return ReleaseRevisions(heads[0] if heads else None, frozenset(revises))


def _named_revisions(script: Path) -> tuple[str, str | None]:
    """``revision`` and ``down_revision`` as ``script`` assigns them."""
    try:
        tree = ast.parse(script.read_bytes(), filename=str(script))
    except (OSError, SyntaxError, ValueError) as exc:
        raise MigrationsUnreadable(f"cannot read the migration {script}: {exc}") from exc
    named: dict[str, object] = {}
    for statement in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign):
            target, value = statement.target, statement.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            named[target.id] = value.value
    revision, down_revision = named.get("revision"), named.get("down_revision")
    if not isinstance(revision, str) or not (
        down_revision is None or isinstance(down_revision, str)
    ):
        raise MigrationsUnreadable(
            f"the migration {script} does not assign its revision and down_revision as "
            "string literals"
        )
    return revision, down_revision


def schema_refusal(revision: str | None, *, newer_allowed: bool = False) -> str | None:
    """``ReleaseRevisions.refusal`` after reading the migration scripts (blocking)."""
    return release_revisions().refusal(revision, newer_allowed=newer_allowed)


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision Alembic recorded in the database (None: no ``alembic_version`` table,
    or an empty one: not migrated)."""
    async with engine.connect() as connection:
        if await connection.scalar(text(f"SELECT to_regclass('{VERSION_TABLE}')")) is None:
            return None
        revisions = (
            await connection.scalars(text(f"SELECT version_num FROM {VERSION_TABLE}"))
        ).all()
    if len(revisions) > 1:
        raise StoreError(
            f"the database records {len(revisions)} schema revisions ({', '.join(revisions)}) "
            "where a release has one"
        )
    return revisions[0] if revisions else None


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
