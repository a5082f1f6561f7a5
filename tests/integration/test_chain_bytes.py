"""The two sides of the chain agree: ``llmgw_event_bytes`` in PostgreSQL (what
``llmgw_append`` hashes) and ``event_bytes`` here (what ``log verify`` hashes) give the same
bytes for any event, whatever its text, its nulls, its payload and its time; and both give
the documented example's."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.store.chain import ChainRow, event_bytes, microseconds, stored_row
from app.store.database import driver_url
from tests.unit.test_chain import EXAMPLE, EXAMPLE_BYTES

SQL_BYTES = (
    "SELECT llmgw_event_bytes($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10::jsonb, $11, $12, "
    "$13, $14, $15), $9::jsonb::text, $10::jsonb::text, pg_catalog.timestamptz_send($8)"
)
texts = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
times = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(driver_url(database_url))
    # The session's settings must not matter: set some that change how values print.
    await connection.execute("SET TimeZone = 'Pacific/Chatham'; SET DateStyle = 'SQL, DMY'")
    await connection.execute("SET extra_float_digits = -15; SET bytea_output = 'escape'")
    yield connection
    await connection.close()


async def sql_row(
    db: asyncpg.Connection, row: ChainRow, recorded_at: datetime
) -> tuple[bytes, ChainRow]:
    found = await db.fetchrow(SQL_BYTES, *_arguments(row, recorded_at))
    assert found is not None
    stored = stored_row((*row[:8], found[3], *row[9:]))
    return bytes(found[0]), stored._replace(data=found[1], meta=found[2])


def _arguments(row: ChainRow, recorded_at: datetime) -> tuple[object, ...]:
    return (
        row.position, row.previous_position, row.stream, row.version, row.type,
        row.schema_version, row.event_id, recorded_at, row.data, row.meta, row.replica_id,
        row.node_id, row.model, row.actor, row.correlation_id,
    )  # fmt: skip


async def test_postgresql_builds_the_documented_example(db: asyncpg.Connection) -> None:
    built, _ = await sql_row(db, EXAMPLE, datetime(2026, 3, 2, 9, 0, 0, 123456, tzinfo=UTC))

    assert built.hex() == EXAMPLE_BYTES


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    position=st.integers(1, 2**62),
    words=st.tuples(texts, texts, texts),
    optional=st.tuples(*(st.none() | texts for _ in range(4))),
    numbers=st.tuples(st.integers(1, 2**31 - 1), st.integers(1, 2**15 - 1)),
    data=json_values,
    meta=st.dictionaries(texts, json_values, max_size=3),
    recorded_at=times,
    event_id=st.uuids(),
)
async def test_both_sides_build_the_same_bytes_for_any_event(
    db: asyncpg.Connection,
    position: int,
    words: tuple[str, str, str],
    optional: tuple[str | None, str | None, str | None, str | None],
    numbers: tuple[int, int],
    data: object,
    meta: dict[str, object],
    recorded_at: datetime,
    event_id: uuid.UUID,
) -> None:
    row = ChainRow(
        position=position,
        previous_position=position - 1,
        chain_hash=None,
        stream=words[0],
        version=numbers[0],
        type=words[1],
        schema_version=numbers[1],
        event_id=event_id,
        recorded_at_us=microseconds(recorded_at),
        data=json.dumps(data, ensure_ascii=False),
        meta=json.dumps(meta, ensure_ascii=False),
        replica_id=optional[0],
        node_id=optional[1],
        model=optional[2],
        actor=words[2],
        correlation_id=optional[3],
    )

    built, as_stored = await sql_row(db, row, recorded_at)

    assert built == event_bytes(as_stored)
    assert as_stored.recorded_at_us == microseconds(recorded_at)
