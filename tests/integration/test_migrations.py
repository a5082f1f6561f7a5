"""Migrations go up, down and up again on an empty database; they are part of the
package, and a missing migrations directory is one line of error."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import asyncpg
import pytest

import app
from app.store import migrate
from tests.support.cluster import SERVER
from tests.support.postgres import PostgresServer, unique_database_name

TABLES = {
    "events",
    "models",
    "nodes",
    "replicas",
    "shards",
    "api_keys",
    "projection_checkpoints",
    "gateway_reports",
    "fold_snapshots",
    "fold_snapshot_chunks",
}
VIEWS = {"audit_log", "replica_history", "node_history", "routing_table"}


async def _relations(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        functions = await conn.fetch("SELECT proname FROM pg_proc WHERE proname LIKE 'llmgw_%'")
    finally:
        await conn.close()
    return {r[0] for r in rows} | {r[0] for r in functions}


async def test_upgrade_downgrade_upgrade(postgres_server: PostgresServer) -> None:
    name = unique_database_name("llmgw_migrations")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        assert TABLES | VIEWS | {"llmgw_append"} <= await _relations(url)

        await asyncio.to_thread(migrate.downgrade, url, "base")
        assert await _relations(url) == {"alembic_version"}

        await asyncio.to_thread(migrate.upgrade, url)
        assert TABLES | VIEWS | {"llmgw_append"} <= await _relations(url)
    finally:
        await postgres_server.drop_database(name)


def test_the_migrations_are_the_packages_own_unless_overridden(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LLMGW_MIGRATIONS_DIR", raising=False)
    packaged = migrate.migrations_dir()
    monkeypatch.setenv("LLMGW_MIGRATIONS_DIR", str(tmp_path))
    (tmp_path / "env.py").write_text("")

    assert packaged == Path(app.__file__).parent / "migrations"
    assert sorted(p.name for p in (packaged / "versions").glob("0001_*.py")) == [
        "0001_event_log_and_projections.py"
    ]
    assert migrate.migrations_dir() == tmp_path


def test_migrate_without_its_migrations_directory_says_so_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-migrations"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}

    result = subprocess.run(
        [SERVER, "migrate"],
        env={
            **env,
            "LLMGW_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/unused",
            "LLMGW_MIGRATIONS_DIR": str(missing),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 1
    assert result.stderr == (
        "llmgw-server migrate: "
        f"cannot migrate: the migrations directory {missing} (LLMGW_MIGRATIONS_DIR) "
        "does not exist\n"
    )


async def _columns(url: str, table: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
        )
    finally:
        await conn.close()
    return {r[0] for r in rows}


async def test_revisions_come_to_rows_projected_before_them_as_revision_1_and_go_again(
    postgres_server: PostgresServer,
) -> None:
    """Migration 0007: a model and a replica projected before revisions existed read as
    revision 1, as their events do; going down removes the columns and nothing else."""
    name = unique_database_name("llmgw_migrations")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    try:
        await asyncio.to_thread(migrate.upgrade, url, "0006")
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO models (name, engine, command, gpus_per_shard, gpu_memory_gib, "
                "shards_per_replica, desired_replicas, removed, weight, target_waiting, "
                "kv_ceiling, spec, replicas_created, declared_at) VALUES ('llama', 'vllm', "
                "'vllm serve', 1, 0, 1, 1, false, 1, 5, 0.8, '{}', 1, now())"
            )
            await conn.execute(
                "INSERT INTO replicas (id, model, number, phase, routable, placed_at, reason) "
                "VALUES ('llama-1', 'llama', 1, 'serving', true, now(), 'scale up')"
            )
        finally:
            await conn.close()

        await asyncio.to_thread(migrate.upgrade, url)
        conn = await asyncpg.connect(url)
        try:
            model = await conn.fetchval("SELECT revision FROM models WHERE name = 'llama'")
            replica = await conn.fetchval("SELECT revision FROM replicas WHERE id = 'llama-1'")
        finally:
            await conn.close()
        assert (model, replica) == (1, 1)

        await asyncio.to_thread(migrate.downgrade, url, "0006")
        assert "revision" not in await _columns(url, "models")
        assert "revision" not in await _columns(url, "replicas")
        assert "backoff_until" in await _columns(url, "models")

        await asyncio.to_thread(migrate.upgrade, url)
        assert "revision" in await _columns(url, "models")
        assert "revision" in await _columns(url, "replicas")
    finally:
        await postgres_server.drop_database(name)


async def test_key_expiry_comes_to_keys_projected_before_it_as_never_and_goes_again(
    postgres_server: PostgresServer,
) -> None:
    """Migration 0014: a key projected before keys could expire never expires, as its
    event says (no ``expires_at``); going down removes the column and keeps the key."""
    name = unique_database_name("llmgw_migrations")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    try:
        await asyncio.to_thread(migrate.upgrade, url, "0013")
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO api_keys (id, name, prefix, secret_hash, models, created_at, "
                "created_by) VALUES ('k-7f3a09c2', 'ci', '7f3a09c2', 'h', '[]', now(), 'alice')"
            )
        finally:
            await conn.close()

        await asyncio.to_thread(migrate.upgrade, url)
        conn = await asyncpg.connect(url)
        try:
            expires_at = await conn.fetchval("SELECT expires_at FROM api_keys WHERE name = 'ci'")
            nullable = await conn.fetchval(
                "SELECT is_nullable FROM information_schema.columns "
                "WHERE table_name = 'api_keys' AND column_name = 'expires_at'"
            )
        finally:
            await conn.close()
        assert (expires_at, nullable) == (None, "YES")

        await asyncio.to_thread(migrate.downgrade, url, "0013")
        conn = await asyncpg.connect(url)
        try:
            kept = await conn.fetchval("SELECT count(*) FROM api_keys WHERE name = 'ci'")
        finally:
            await conn.close()
        assert "expires_at" not in await _columns(url, "api_keys")
        assert kept == 1

        await asyncio.to_thread(migrate.upgrade, url)
        assert "expires_at" in await _columns(url, "api_keys")
    finally:
        await postgres_server.drop_database(name)


async def _index_definition(url: str, name: str) -> str | None:
    conn = await asyncpg.connect(url)
    try:
        definition: str | None = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1", name
        )
    finally:
        await conn.close()
    return definition


@pytest.mark.parametrize(
    ("revision", "index", "definition"),
    [
        # The routable replicas, so that a read of every route does not pass over every
        # replica that ever ran.
        (
            "0018",
            "ix_replicas_routable",
            "CREATE INDEX ix_replicas_routable ON public.replicas "
            "USING btree (model, id) WHERE routable",
        ),
        # Every replica in the replica list's order, byte by byte, so that a page of the
        # list is read off it.
        (
            "0019",
            "ix_replicas_listing",
            "CREATE INDEX ix_replicas_listing ON public.replicas "
            'USING btree (model COLLATE "C", number, id COLLATE "C")',
        ),
    ],
)
async def test_an_index_of_the_projection_comes_and_goes_with_its_migration(
    postgres_server: PostgresServer, revision: str, index: str, definition: str
) -> None:
    name = unique_database_name("llmgw_migrations")
    await postgres_server.create_database(name)
    url = postgres_server.url(name)
    before = f"{int(revision) - 1:04d}"
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        assert await _index_definition(url, index) == definition

        await asyncio.to_thread(migrate.downgrade, url, before)
        assert await _index_definition(url, index) is None

        await asyncio.to_thread(migrate.upgrade, url)
        assert await _index_definition(url, index) == definition
    finally:
        await postgres_server.drop_database(name)
