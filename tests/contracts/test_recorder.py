"""The recorder's contract: where the caller says its fold ends is checked atomically with
the write, the same way by every recorder."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta, Recorded
from app.domain.events import NodeRegistered, node_stream
from app.store.errors import LogMovedOn
from app.store.memory import InMemoryRecorder
from app.store.postgres import PostgresRecorder
from app.store.projection import RowChanges
from app.store.recorder import Recorder

META = Meta(actor="alice")
NO_ROWS = RowChanges(touched={"models": [], "nodes": [], "replicas": [], "api_keys": []}, rows={})


@pytest.fixture(params=["memory", "postgres"])
def recorder(request: pytest.FixtureRequest) -> Recorder:
    if request.param == "memory":
        return InMemoryRecorder()
    engine: AsyncEngine = request.getfixturevalue("engine")
    return PostgresRecorder(engine)


def registered(position: int) -> Recorded:
    """A node's first event, to be recorded after ``position``."""
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    return Recorded(
        position=position + 1,
        stream=node_stream(node),
        version=1,
        event_id=uuid.uuid4(),
        recorded_at=datetime.now(UTC),
        meta=META,
        event=NodeRegistered(node_id=node, address="127.0.0.1"),
    )


async def test_a_batch_after_another_event_at_the_logs_last_position_is_refused(
    recorder: Recorder,
) -> None:
    first = registered(0)
    async with recorder.session() as session:
        (position,) = (await session.record([first], NO_ROWS, META, 0, None)).values()
        second = registered(position)

        with pytest.raises(LogMovedOn):
            await session.record([second], NO_ROWS, META, position, uuid.uuid4())
        with pytest.raises(LogMovedOn):
            await session.record([second], NO_ROWS, META, position, None)
        assert [r.event_id for r in await session.events_after(0, 10)] == [first.event_id]

        await session.record([second], NO_ROWS, META, position, first.event_id)
        stored = await session.events_after(0, 10)

    assert [r.event_id for r in stored] == [first.event_id, second.event_id]


async def test_a_batch_after_an_event_is_refused_by_an_empty_log(recorder: Recorder) -> None:
    event = registered(0)
    async with recorder.session() as session:
        with pytest.raises(LogMovedOn):
            await session.record([event], NO_ROWS, META, 0, uuid.uuid4())
        assert await session.events_after(0, 10) == []
