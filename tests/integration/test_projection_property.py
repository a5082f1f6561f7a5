"""For any sequence of events, the projection kept inline by appends equals a full rebuild."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.envelope import Meta
from app.domain.events import AnyEvent
from app.store.database import create_engine
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.projection import all_rows
from app.store.rebuild import rebuild, replay
from tests.support.generators import events, stream_for


def test_inline_projection_equals_a_full_rebuild(database_url: str) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(st.lists(events(), min_size=1, max_size=5), min_size=1, max_size=8))
    def appended_then_verified(batches: list[list[AnyEvent]]) -> None:
        asyncio.run(_append_and_verify(database_url, batches))

    appended_then_verified()


async def _append_and_verify(url: str, batches: list[list[AnyEvent]]) -> None:
    engine = create_engine(url, pool_size=2)
    try:
        store = PostgresEventStore(engine)
        for batch in batches:
            requests = [AppendRequest(stream_for(e), None, [NewEvent(e)]) for e in batch]
            await store.append_many(requests, Meta(actor="property"))

        report = await rebuild(engine, verify=True)
        assert report.differences == []
        # The live store's fold, the replayed fold and the tables are one picture.
        assert all_rows(store.state) == all_rows(await replay(engine))
    finally:
        await engine.dispose()
