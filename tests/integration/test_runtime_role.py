"""The runtime role, as ``llmgw-server migrate --runtime-role`` sets it up, against a real
PostgreSQL: whatever it tries on the log's tables directly is refused by the database, and
everything the server and the gateways do still works through it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, NodeRegistered, node_stream
from app.services.leader import NEXT_EPOCH
from app.store.database import create_engine, driver_url
from app.store.gateway_reports import InFlightReports, delete_report, write_report
from app.store.interface import NO_STREAM, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.privileges import privileged_role
from app.store.tables import PROJECTION_TABLES
from tests.support.databases import TEST_RUNTIME_ROLE, runtime_url

ALICE = Meta(actor="alice")
DIRECT_CHANGES = (
    "UPDATE events SET actor = 'mallory'",
    "DELETE FROM events",
    "TRUNCATE events",
    "INSERT INTO events (previous_position, chain_hash, stream, version, type, "
    "schema_version, data, meta, event_id, recorded_at, actor) SELECT position, chain_hash, "
    "stream, version + 1, type, schema_version, data, meta, gen_random_uuid(), now(), actor "
    "FROM events ORDER BY position DESC LIMIT 1",
    "ALTER TABLE events DISABLE TRIGGER events_no_update_delete",
    "ALTER TABLE events DISABLE TRIGGER ALL",
    "DROP TRIGGER events_no_update_delete ON events",
    "ALTER TABLE events DROP COLUMN chain_hash",
    "CREATE TRIGGER sneaky BEFORE INSERT ON events FOR EACH ROW "
    "EXECUTE FUNCTION events_refuse_change()",
    "SET session_replication_role = replica",
    "CREATE OR REPLACE FUNCTION llmgw_chain_text(value text) RETURNS bytea "
    "LANGUAGE sql AS $$ SELECT '\\x'::bytea $$",
    "UPDATE leadership SET epoch = 0",
    "UPDATE projection_checkpoints SET position = 0",
    "SELECT nextval('events_position_seq')",
)
PROJECTION_WRITES = tuple(
    statement
    for table in PROJECTION_TABLES
    for statement in (
        f"DELETE FROM {table.name}",
        f"TRUNCATE {table.name}",
        f"INSERT INTO {table.name} SELECT * FROM {table.name} LIMIT 1",
        f"UPDATE {table.name} SET {next(iter(table.columns)).name} = "
        f"{next(iter(table.columns)).name}",
    )
)


@pytest_asyncio.fixture(loop_scope="session")
async def as_runtime(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(driver_url(runtime_url(database_url)))
    yield connection
    await connection.close()


@pytest_asyncio.fixture(loop_scope="session")
async def runtime_store(database_url: str) -> AsyncIterator[PostgresEventStore]:
    engine = create_engine(runtime_url(database_url), pool_size=2)
    yield PostgresEventStore(engine)
    await engine.dispose()


def node_registered(node_id: str) -> NewEvent:
    return NewEvent(NodeRegistered(node_id=node_id, address="127.0.0.9"))


async def test_the_runtime_role_appends_through_the_store_and_the_projection_follows(
    runtime_store: PostgresEventStore, as_runtime: asyncpg.Connection
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"

    recorded = await runtime_store.append(
        node_stream(node), NO_STREAM, [node_registered(node)], ALICE
    )
    await runtime_store.append(
        node_stream(node), 1, [NewEvent(NodeCordoned(node_id=node, reason="disk"))], ALICE
    )

    assert await as_runtime.fetchval("SELECT current_user") == TEST_RUNTIME_ROLE.name
    assert await as_runtime.fetchval("SELECT cordoned FROM nodes WHERE id = $1", node) is True
    stored = await as_runtime.fetchrow(
        "SELECT previous_position, octet_length(chain_hash) FROM events WHERE position = $1",
        recorded[0].position,
    )
    assert stored["octet_length"] == 32
    assert stored["previous_position"] == recorded[0].position - 1
    checkpoint = await as_runtime.fetchval("SELECT position FROM projection_checkpoints")
    assert checkpoint == recorded[0].position + 1


@pytest.mark.parametrize("statement", DIRECT_CHANGES + PROJECTION_WRITES)
async def test_the_runtime_role_cannot_change_the_log_or_its_tables_directly(
    statement: str,
    runtime_store: PostgresEventStore,
    as_runtime: asyncpg.Connection,
    database_url: str,
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    await runtime_store.append(node_stream(node), NO_STREAM, [node_registered(node)], ALICE)
    owner = await asyncpg.connect(driver_url(database_url))
    try:
        before = await owner.fetch("SELECT * FROM events ORDER BY position")

        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await as_runtime.execute(statement)

        assert await owner.fetch("SELECT * FROM events ORDER BY position") == before
        assert (
            await owner.fetchval(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'events'::regclass "
                "AND NOT tgisinternal AND tgenabled = 'O'"
            )
            == 2
        )
    finally:
        await owner.close()


async def test_the_runtime_role_owns_nothing_and_its_own_check_passes(
    database_url: str, as_runtime: asyncpg.Connection
) -> None:
    owned = await as_runtime.fetch(
        "SELECT relname FROM pg_class WHERE pg_has_role(current_user, relowner, 'MEMBER') "
        "UNION ALL SELECT proname FROM pg_proc "
        "WHERE pg_has_role(current_user, proowner, 'MEMBER')"
    )

    assert owned == []
    assert await privileged_role(runtime_url(database_url)) == (TEST_RUNTIME_ROLE.name, None)
    role, reason = await privileged_role(database_url)
    assert reason == "is a superuser", role


async def test_the_runtime_role_bumps_the_epoch_by_one_and_reports_its_requests(
    database_url: str, as_runtime: asyncpg.Connection
) -> None:
    engine = create_engine(runtime_url(database_url), pool_size=1)
    try:
        first = await as_runtime.fetchval(NEXT_EPOCH, "server-a")
        second = await as_runtime.fetchval(NEXT_EPOCH, "server-b")
        await write_report(as_runtime, "gw-1", {"m-1": 2, "m-2": 0}, within_s=5, instance="test")
        in_flight = await InFlightReports(engine).read_in_flight()
        await delete_report(as_runtime, "gw-1", within_s=5, instance="test")
        after = await InFlightReports(engine).read_in_flight()
    finally:
        await engine.dispose()

    assert second == first + 1
    holder = await as_runtime.fetchval("SELECT holder FROM leadership WHERE id = 1")
    assert holder == "server-b"
    assert in_flight == {"m-1": 2}
    assert after == {}


async def test_the_runtime_role_writes_fold_snapshots_whole_and_never_rewrites_one(
    runtime_store: PostgresEventStore, as_runtime: asyncpg.Connection, database_url: str
) -> None:
    for n in range(3):
        node = f"gpu-{uuid.uuid4().hex[:6]}-{n}"
        await runtime_store.append(node_stream(node), NO_STREAM, [node_registered(node)], ALICE)

    position = await runtime_store.save_snapshot()
    engine = create_engine(runtime_url(database_url), pool_size=2)
    try:
        restarted = PostgresEventStore(engine, policy=None)
        await restarted.catch_up()
    finally:
        await engine.dispose()

    assert position == runtime_store.state.position
    assert restarted.state.nodes == runtime_store.state.nodes
    for statement in (
        "UPDATE fold_snapshots SET fingerprint = fingerprint",
        "UPDATE fold_snapshot_chunks SET data = data",
        "TRUNCATE fold_snapshots",
        "TRUNCATE fold_snapshot_chunks",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await as_runtime.execute(statement)
