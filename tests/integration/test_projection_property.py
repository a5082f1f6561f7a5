"""For any sequence of events, the projection kept inline by appends equals a full rebuild."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.envelope import Meta
from app.domain.events import AnyEvent, ModelDeclared
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.store.database import create_engine
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.projection import all_rows
from app.store.rebuild import rebuild
from app.store.replay import replay
from tests.support.generators import events, histories, stream_for

META = Meta(actor="property")


def test_inline_projection_equals_a_full_rebuild(database_url: str) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(histories(st.lists(st.lists(events(), min_size=1, max_size=5), min_size=1, max_size=8)))
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


async def test_numbers_far_outside_todays_bounds_still_rebuild_identically(
    database_url: str,
) -> None:
    """A log written before specs were bounded may hold any float; verifying it must not
    report differences that a rebuild cannot remove."""
    spec = ModelSpec(
        name="llama",
        command="vllm serve {model}",
        gpu_memory_gib=1.7976931348623157e308,
        startup_timeout_s=5e-324,
        stop_grace_s=1e308,
        routing=RoutingSettings(weight=1.2345678901234567e300, kv_ceiling=1e-300),
    )
    engine = create_engine(database_url, pool_size=2)
    try:
        store = PostgresEventStore(engine)
        await store.append(
            "model-llama", None, [NewEvent(ModelDeclared(model="llama", spec=spec))], META
        )

        report = await rebuild(engine, verify=True)

        assert report.differences == []
        assert all_rows(store.state) == all_rows(await replay(engine))
    finally:
        await engine.dispose()
