"""What ``llmgw_append`` refuses a runtime role, against a real PostgreSQL: a time far from
the database's clock (the log cannot be backdated), and projection rows of entities no
appended event is about (the tables cannot be rewritten behind the log's back). The owner,
who may write the tables directly anyway, records the times it gives."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from app.clock import utc_now
from app.domain.envelope import Meta
from app.domain.events import (
    ModelDeclared,
    NodeCordoned,
    NodeRegistered,
    RolloutHoldEjectionSeen,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.store.database import create_engine, driver_url
from app.store.errors import StoreError
from app.store.interface import NO_STREAM, NewEvent
from app.store.postgres import _APPEND_CALL, NOTIFY_CHANNEL, PostgresEventStore
from tests.support.admin_server import bearer_client, problem_of, serving_admin
from tests.support.databases import runtime_url
from tests.support.seed import placed

ALICE = Meta(actor="alice")


@pytest_asyncio.fixture(loop_scope="session")
async def as_runtime(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(driver_url(runtime_url(database_url)))
    yield connection
    await connection.close()


async def store_with_clock(url: str, moment: datetime) -> AsyncIterator[PostgresEventStore]:
    engine = create_engine(url, pool_size=1)
    try:
        yield PostgresEventStore(engine, clock=lambda: moment, policy=None)
    finally:
        await engine.dispose()


def new_node() -> str:
    return f"gpu-{uuid.uuid4().hex[:6]}"


def registered(node: str) -> NewEvent:
    return NewEvent(NodeRegistered(node_id=node, address="127.0.0.9"))


@pytest.mark.parametrize("off", [timedelta(hours=-3), timedelta(minutes=5)])
async def test_the_runtime_role_cannot_record_events_at_a_time_of_its_choosing(
    database_url: str, off: timedelta
) -> None:
    node = new_node()
    async for store in store_with_clock(runtime_url(database_url), utc_now() + off):
        with pytest.raises(StoreError, match="from the database's clock"):
            await store.append(node_stream(node), NO_STREAM, [registered(node)], ALICE)

    owner = await asyncpg.connect(driver_url(database_url))
    try:
        assert await owner.fetchval("SELECT count(*) FROM events") == 0
        assert await owner.fetchval("SELECT count(*) FROM nodes") == 0
    finally:
        await owner.close()


async def test_the_runtime_role_records_at_the_database_time_and_the_owner_at_its_own(
    database_url: str,
) -> None:
    node, imported = new_node(), new_node()
    async for store in store_with_clock(runtime_url(database_url), utc_now()):
        await store.append(node_stream(node), NO_STREAM, [registered(node)], ALICE)
    long_ago = datetime(2026, 3, 11, tzinfo=UTC)
    async for store in store_with_clock(database_url, long_ago):
        await store.append(node_stream(imported), NO_STREAM, [registered(imported)], ALICE)

    owner = await asyncpg.connect(driver_url(database_url))
    try:
        times = dict(await owner.fetch("SELECT stream, recorded_at FROM events"))
        now = await owner.fetchval("SELECT clock_timestamp()")
    finally:
        await owner.close()
    assert abs(now - times[node_stream(node)]) < timedelta(minutes=1)
    assert times[node_stream(imported)] == long_ago


async def hostile_append(
    db: asyncpg.Connection,
    events: list[tuple[str, Any]],
    touched: dict[str, list[str]],
    rows: dict[str, list[dict[str, Any]]],
) -> None:
    """``llmgw_append`` called as a compromised server would: ``events`` are (stream,
    event) pairs about nodes; the rows and the entities they replace are whatever it likes."""
    last = await db.fetchrow("SELECT position, event_id FROM events ORDER BY position DESC")
    versions = [
        await db.fetchval(
            "SELECT coalesce(max(version), 0) + 1 FROM events WHERE stream = $1", stream
        )
        for stream, _ in events
    ]
    await db.fetch(
        _APPEND_CALL,
        last["position"] if last else 0,
        last["event_id"] if last else None,
        None,
        [stream for stream, _ in events],
        versions,
        [type(event).__struct_config__.tag for _, event in events],
        [1 for _ in events],
        [json.dumps({"node_id": event.node_id, "reason": "x"}) for _, event in events],
        [uuid.uuid4() for _ in events],
        [None for _ in events],
        [event.node_id for _, event in events],
        [None for _ in events],
        json.dumps({"actor": "mallory"}),
        utc_now(),
        "mallory",
        None,
        touched.get("models", []),
        touched.get("nodes", []),
        touched.get("replicas", []),
        touched.get("api_keys", []),
        json.dumps(rows, default=str),
        NOTIFY_CHANNEL,
    )


async def node_row(db: asyncpg.Connection, node: str, **changes: Any) -> dict[str, Any]:
    row = json.loads(await db.fetchval("SELECT to_jsonb(n)::text FROM nodes n WHERE id = $1", node))
    return {**row, **changes}


async def test_a_projection_row_no_appended_event_is_about_is_refused(
    database_url: str, as_runtime: asyncpg.Connection
) -> None:
    honest, victim = new_node(), new_node()
    async for store in store_with_clock(runtime_url(database_url), utc_now()):
        for node in (honest, victim):
            await store.append(node_stream(node), NO_STREAM, [registered(node)], ALICE)
    before = await as_runtime.fetch("SELECT * FROM events ORDER BY position")
    rerouted = await node_row(as_runtime, victim, address="127.0.0.66")
    cordon = (node_stream(honest), NodeCordoned(node_id=honest, reason="x"))

    attempts = [
        # No event at all: the tables changed while the log gained nothing.
        ([], {"nodes": [victim]}, {"nodes": [rerouted]}),
        # An event about one node, the row of another.
        ([cordon], {"nodes": [honest, victim]}, {"nodes": [rerouted]}),
        # A row slipped in beside the entities named.
        ([cordon], {"nodes": [honest]}, {"nodes": [rerouted]}),
        ([cordon], {"api_keys": ["k-1"]}, {}),
        ([cordon], {"models": ["llama"]}, {}),
        ([cordon], {"replicas": ["llama-1"]}, {}),
    ]
    for events, touched, rows in attempts:
        with pytest.raises(asyncpg.PostgresError, match="no appended event is about") as refused:
            await hostile_append(as_runtime, events, touched, rows)
        assert refused.value.sqlstate == "LG006"

    assert await as_runtime.fetch("SELECT * FROM events ORDER BY position") == before
    assert await as_runtime.fetchval("SELECT address FROM nodes WHERE id = $1", victim) == (
        "127.0.0.9"
    )
    # The row of the node the event is about is still the caller's to write.
    await hostile_append(
        as_runtime, [cordon], {"nodes": [honest]}, {"nodes": [await node_row(as_runtime, honest)]}
    )


async def test_the_runtime_role_records_a_replica_ejected_during_a_hold(
    database_url: str,
) -> None:
    # An ejection seen during a rollout's hold is about the model and its replica: the
    # entities it touches are the ones its row in the log names, so the guards let it in.
    model, node = f"m-{uuid.uuid4().hex[:6]}", new_node()
    replica = placed(model, 1, node, 0, 20000)
    spec = ModelSpec(name=model, command="sim --port {port} --model {model}")
    seen = RolloutHoldEjectionSeen(
        model=model,
        rollout_id=f"rollout-{model}-r2",
        step=0,
        replica_id=replica.replica_id,
        gateways=2,
    )
    async for store in store_with_clock(runtime_url(database_url), utc_now()):
        await store.append(node_stream(node), NO_STREAM, [registered(node)], ALICE)
        declared = NewEvent(ModelDeclared(model=model, spec=spec))
        await store.append(model_stream(model), NO_STREAM, [declared], ALICE)
        await store.append(
            replica_stream(replica.replica_id), NO_STREAM, [NewEvent(replica)], ALICE
        )
        await store.append(model_stream(model), None, [NewEvent(seen)], Meta(actor="reconciler"))

    owner = await asyncpg.connect(driver_url(database_url))
    try:
        row = await owner.fetchrow(
            "SELECT model, replica_id FROM events WHERE type = 'rollout_hold_ejection_seen' "
            "AND model = $1",
            model,
        )
    finally:
        await owner.close()
    assert row is not None
    assert (row["model"], row["replica_id"]) == (model, replica.replica_id)


async def test_an_admin_api_whose_clock_is_off_refuses_writes_saying_so(
    database_url: str,
) -> None:
    node = new_node()
    async for store in store_with_clock(runtime_url(database_url), utc_now()):
        await store.append(node_stream(node), NO_STREAM, [registered(node)], ALICE)
    engine = create_engine(runtime_url(database_url), pool_size=1)
    ahead = PostgresEventStore(engine, clock=lambda: utc_now() + timedelta(minutes=2))
    try:
        async with (
            serving_admin(ahead, tokens={"clock-token": "alice"}) as url,
            bearer_client(url, "clock-token") as client,
        ):
            answer = await client.post(
                f"/admin/v1/nodes/{node}/cordon", json={"reason": "maintenance"}
            )
    finally:
        await engine.dispose()

    body = problem_of(answer, 503)
    assert body["title"] == "clock-off"
    detail = body["detail"]
    assert re.search(r"this server's clock is 1[12]\d\.\d s ahead of the database's", detail)
    assert "set this server's clock right (NTP)" in detail
    assert "send the change to another control plane" in detail
    owner = await asyncpg.connect(driver_url(database_url))
    try:
        cordons = "SELECT count(*) FROM events WHERE stream = $1 AND type = 'NodeCordoned'"
        assert await owner.fetchval(cordons, node_stream(node)) == 0
    finally:
        await owner.close()
