"""The PostgreSQL event log under concurrency, and the database's own guard rails."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, NodeRegistered
from app.store.errors import ConcurrencyError
from app.store.interface import NO_STREAM, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.subscription import Subscription
from tests.support.waiting import wait_until

ACTOR = Meta(actor="test")


def cordon(node: str, n: int) -> NewEvent:
    return NewEvent(NodeCordoned(node_id=node, reason=f"step {n}"))


async def test_eight_appenders_and_a_tailer_that_never_skips(engine: AsyncEngine) -> None:
    writers = [PostgresEventStore(engine) for _ in range(8)]
    done = asyncio.Event()
    seen: list[int] = []

    async def append_2000(store: PostgresEventStore, n: int) -> None:
        node = f"gpu-{n}"
        for batch in range(400):  # 2,000 events, five per transaction
            events = [cordon(node, batch * 5 + i) for i in range(5)]
            await store.append(f"node-{node}", None, events, ACTOR)

    async def tail() -> None:
        reader = PostgresEventStore(engine)
        while True:
            finished = done.is_set()
            batch = await reader.read_all(seen[-1] if seen else 0, limit=500)
            seen.extend(r.position for r in batch)
            if finished and not batch:
                return

    tailer = asyncio.create_task(tail())
    await asyncio.gather(*(append_2000(w, n) for n, w in enumerate(writers)))
    done.set()
    await asyncio.wait_for(tailer, 60)

    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        stored = [
            r[0]
            for r in await raw.driver_connection.fetch("SELECT position FROM events ORDER BY 1")
        ]
    assert len(stored) == 16_000
    assert seen == stored  # every position exactly once, in order, none skipped


async def test_losers_of_a_version_race_leave_no_hole(engine: AsyncEngine) -> None:
    store = PostgresEventStore(engine)
    node = f"gpu-{uuid.uuid4().hex[:6]}"

    async def register() -> bool:
        try:
            await PostgresEventStore(engine).append(
                f"node-{node}",
                NO_STREAM,
                [NewEvent(NodeRegistered(node_id=node, address="h"))],
                ACTOR,
            )
        except ConcurrencyError:
            return False
        return True

    outcomes = await asyncio.gather(*(register() for _ in range(8)))
    await store.append("node-other", None, [cordon("other", 1)], ACTOR)

    assert outcomes.count(True) == 1
    positions = [r.position for r in await store.read_all(0)]
    assert positions == list(range(1, len(positions) + 1))
    assert len(positions) == 2


async def test_the_database_refuses_to_change_history(
    database_url: str, pg_store: PostgresEventStore
) -> None:
    await pg_store.append("node-a", None, [cordon("a", 1)], ACTOR)
    conn = await asyncpg.connect(database_url)
    try:
        for statement in (
            "UPDATE events SET actor = 'mallory'",
            "DELETE FROM events",
            "TRUNCATE events",
        ):
            with pytest.raises(asyncpg.PostgresError, match="append-only"):
                await conn.execute(statement)
        assert await conn.fetchval("SELECT actor FROM events") == "test"
    finally:
        await conn.close()


async def test_a_subscriber_survives_its_listen_connection_being_killed(
    database_url: str, pg_store: PostgresEventStore
) -> None:
    # Polling is slowed to a minute: only LISTEN can deliver within the deadline.
    subscription = Subscription(pg_store, database_url, poll_interval_s=60, name="killed")
    received: asyncio.Queue[int] = asyncio.Queue()

    async def follow() -> None:
        async for recorded in subscription:
            await received.put(recorded.position)

    follower = asyncio.create_task(follow())
    try:
        await asyncio.wait_for(subscription.listening.wait(), 10)
        first = await pg_store.append("node-a", None, [cordon("a", 1)], ACTOR)
        assert await asyncio.wait_for(received.get(), 10) == first[0].position

        admin = await asyncpg.connect(database_url)
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1",
            subscription.application_name,
        )
        await admin.close()
        assert killed == 1
        await wait_until(
            lambda: subscription.connections == 2 and subscription.listening.is_set(),
            what="LISTEN reconnected",
        )

        later = await pg_store.append("node-a", None, [cordon("a", 2)], ACTOR)
        assert await asyncio.wait_for(received.get(), 10) == later[0].position
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
