"""A gateway that reads only the routes changed since its position holds, after any history,
what a read of every route finds (``app.gateway.held_routes``, ``app.store.routing_rows``),
whether that read scans the shards or looks the routable replicas' first shards up."""

from __future__ import annotations

import asyncio

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ModelRemoved,
    ModelTuned,
    NodeConnected,
    NodeForgotten,
    NodeLost,
    NodeRegistered,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopped,
    ShardPlacement,
    ShardStopped,
)
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.gateway.held_routes import HeldRoutes
from app.gateway.snapshot import read_routing
from app.store.database import create_engine, driver_url
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.routing_rows import MAX_EVENTS_READ_AS_CHANGES, read_routing_rows
from tests.support.generators import MODELS, NODES, REPLICAS, events, histories, stream_for
from tests.support.route_rows import route_row

META = Meta(actor="property")


def _spec(model: str, weight: float) -> ModelSpec:
    return ModelSpec(
        name=model, command="sim --port {port}", routing=RoutingSettings(weight=weight)
    )


@st.composite
def _serving_fleet(draw: st.DrawFn) -> list[list[AnyEvent]]:
    """Batches that put replicas into routing and then change what their routes read: a
    node's addresses, a model's routing settings, a replica's tuned weight, drains, stops,
    a lost or forgotten node, a removed model (the generated events of ``histories`` come
    in between, and may contradict any of it)."""
    batches: list[list[AnyEvent]] = [
        [ModelDeclared(model=m, spec=_spec(m, 1.0)) for m in MODELS],
        [NodeRegistered(node_id=n, address=f"127.0.0.{i}") for i, n in enumerate(NODES, start=1)],
    ]
    for number, replica_id in enumerate(REPLICAS, start=1):
        node = draw(st.sampled_from(NODES))
        shard = ShardPlacement(index=0, node_id=node, gpus=(0,), port=20000 + number)
        model = replica_id.rsplit("-", 1)[0]
        placed = ReplicaPlaced(replica_id=replica_id, model=model, number=number, shards=(shard,))
        batches.append([placed, ReplicaServing(replica_id=replica_id)])
    changes = st.one_of(
        st.builds(
            lambda n, last: NodeConnected(
                node_id=n, address=f"127.0.1.{last}", remote_address=f"127.0.2.{last}"
            ),
            st.sampled_from(NODES),
            st.integers(1, 254),
        ),
        st.builds(
            lambda m, w: ModelDeclared(model=m, spec=_spec(m, w)),
            st.sampled_from(MODELS),
            st.sampled_from((0.5, 2.0, 3.0)),
        ),
        st.builds(
            lambda m, r, w: ModelTuned(
                model=m, replica_id=r, weight=w, target_waiting=3, kv_ceiling=0.8
            ),
            st.sampled_from(MODELS),
            st.none() | st.sampled_from(REPLICAS),
            st.sampled_from((0.25, 4.0)),
        ),
        st.builds(
            lambda r: ReplicaDrainStarted(replica_id=r, drain_id="d1"), st.sampled_from(REPLICAS)
        ),
        st.builds(lambda r: ReplicaStopped(replica_id=r), st.sampled_from(REPLICAS)),
        st.builds(lambda r: ReplicaServing(replica_id=r), st.sampled_from(REPLICAS)),
        st.builds(
            lambda r, n: ShardStopped(replica_id=r, shard_index=0, node_id=n),
            st.sampled_from(REPLICAS),
            st.sampled_from(NODES),
        ),
        st.builds(lambda n: NodeLost(node_id=n, disconnected_for_s=61), st.sampled_from(NODES)),
        st.builds(lambda n: NodeForgotten(node_id=n, reason="gone"), st.sampled_from(NODES)),
        st.builds(lambda m: ModelRemoved(model=m), st.sampled_from(MODELS)),
    )
    batches += draw(st.lists(st.lists(changes, min_size=1, max_size=3), max_size=12))
    return batches


@st.composite
def _fleet_histories(draw: st.DrawFn) -> list[list[AnyEvent]]:
    fleet = draw(_serving_fleet())
    generated = draw(histories(st.lists(st.lists(events(), min_size=1, max_size=3), max_size=6)))
    woven: list[list[AnyEvent]] = []
    while fleet or generated:
        source = generated if not fleet or (generated and draw(st.booleans())) else fleet
        woven.append(source.pop(0))
    return woven


def test_routes_read_as_changes_equal_every_route_read(database_url: str) -> None:
    routes_seen: list[int] = []

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(_fleet_histories())
    def appended_then_compared(batches: list[list[AnyEvent]]) -> None:
        routes_seen.extend(asyncio.run(_append_and_compare(database_url, batches)))

    appended_then_compared()
    # The histories put replicas into routing: the comparison is of something.
    assert max(routes_seen) >= len(REPLICAS) // 2


async def _append_and_compare(url: str, batches: list[list[AnyEvent]]) -> list[int]:
    engine = create_engine(url, pool_size=2)
    db = await asyncpg.connect(driver_url(url))
    routes_held: list[int] = []
    try:
        store = PostgresEventStore(engine)
        _, held = await read_routing(db, within_s=5.0)
        for batch in batches:
            await _append(store, batch)
            snapshot, held = await read_routing(db, within_s=5.0, held=held)
            whole_snapshot, whole = await read_routing(db, within_s=5.0)
            assert held == whole
            assert snapshot.routes == whole_snapshot.routes
            # Every route read again, the first shards looked up instead of scanned for.
            looked_up = await read_routing_rows(db, within_s=5.0, first_shards_looked_up=True)
            assert {r.replica_id: r for r in looked_up.routes} == dict(whole.rows)
            routes_held.append(len(held.rows))
    finally:
        await db.close()
        await engine.dispose()
    return routes_held


async def test_a_read_further_back_than_its_bound_reads_every_route(database_url: str) -> None:
    """More events since the position held than a read of changes looks up: every route is
    read, and what was held is replaced, not patched."""
    engine = create_engine(database_url, pool_size=2)
    db = await asyncpg.connect(driver_url(database_url))
    try:
        store = PostgresEventStore(engine)
        first: list[AnyEvent] = [ModelDeclared(model="llama", spec=_spec("llama", 1.0))]
        await _append(store, first)
        _, held = await read_routing(db, within_s=5.0)
        stale = HeldRoutes(held.position, {"gone-1": route_row("gone-1")})
        many = [
            NodeRegistered(node_id=f"n{i}", address=f"127.3.{i // 250}.{i % 250}")
            for i in range(MAX_EVENTS_READ_AS_CHANGES + 1)
        ]
        await _append(store, many)

        _, after = await read_routing(db, within_s=5.0, held=stale)

        assert after.rows == {}
        assert after.position == held.position + len(many)
    finally:
        await db.close()
        await engine.dispose()


async def test_a_read_of_changes_leaves_the_routes_no_event_names_as_held(
    database_url: str,
) -> None:
    """A read since the position held reads the routes the events since then name, and no
    other: a route held that no event names stays as held (a read of every route would
    have dropped this one, which the projection does not have)."""
    engine = create_engine(database_url, pool_size=2)
    db = await asyncpg.connect(driver_url(database_url))
    try:
        store = PostgresEventStore(engine)
        await _append(store, [ModelDeclared(model="llama", spec=_spec("llama", 1.0))])
        _, held = await read_routing(db, within_s=5.0)
        untouched = route_row("qwen-7", address="127.9.9.9")
        held = HeldRoutes(held.position, {untouched.replica_id: untouched})

        await _append(store, [NodeRegistered(node_id="gpu-9", address="127.0.0.9")])
        _, after = await read_routing(db, within_s=5.0, held=held)

        assert after.rows == {"qwen-7": untouched}
        assert after.position == held.position + 1
    finally:
        await db.close()
        await engine.dispose()


async def _append(store: PostgresEventStore, batch: list[AnyEvent]) -> None:
    await store.append_many(
        [AppendRequest(stream_for(e), None, [NewEvent(e)]) for e in batch], META
    )
