"""A read of every route after a long history: once the projection holds many ended
replicas' shards per routable replica, the read looks the routable replicas' first shards
up rather than scanning every shard, and reads the same routes either way
(``app.store.routing_rows``, ``SHARDS_PER_ROUTE_SCANNED``)."""

from __future__ import annotations

import asyncpg

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    NodeConnected,
    NodeRegistered,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopped,
    ShardPlacement,
)
from app.domain.model_spec import ModelSpec
from app.store.database import create_engine, driver_url
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.routing_rows import (
    SHARDS_PER_ROUTE_SCANNED,
    RouteRow,
    read_routing_rows,
    shards_many_per_route,
)
from tests.support.generators import stream_for

META = Meta(actor="history")
SERVING = 2
ENDED = int(SERVING * SHARDS_PER_ROUTE_SCANNED) + 4


def _placed(number: int) -> ReplicaPlaced:
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(number % 8,), port=20000 + number)
    return ReplicaPlaced(
        replica_id=f"llama-{number}", model="llama", number=number, shards=(shard,)
    )


def _by_replica(routes: list[RouteRow]) -> list[RouteRow]:
    return sorted(routes, key=lambda r: r.replica_id)


async def test_a_long_history_is_read_past_by_looking_up_the_routes_first_shards(
    database_url: str,
) -> None:
    engine = create_engine(database_url, pool_size=2)
    db = await asyncpg.connect(driver_url(database_url))
    try:
        store = PostgresEventStore(engine)
        await _append(
            store,
            [
                ModelDeclared(model="llama", spec=ModelSpec(name="llama", command="sim {port}")),
                NodeRegistered(node_id="gpu-1", address="127.0.0.1"),
                NodeConnected(node_id="gpu-1", address="127.0.0.1", remote_address="127.0.0.2"),
            ],
        )
        serving = [_placed(n) for n in range(1, SERVING + 1)]
        await _append(
            store, [*serving, *(ReplicaServing(replica_id=p.replica_id) for p in serving)]
        )
        await db.execute("ANALYZE")
        short_history = await shards_many_per_route(db, within_s=5.0)

        # Replicas that ran and ended, one at a time, as a fleet that scales and rolls
        # out piles them up: the projection keeps every one's rows.
        for number in range(SERVING + 1, SERVING + ENDED + 1):
            ended = _placed(number)
            await _append(store, [ended, ReplicaStopped(replica_id=ended.replica_id)])
        await db.execute("ANALYZE")
        long_history = await shards_many_per_route(db, within_s=5.0)
        looked_up = await read_routing_rows(db, within_s=5.0, first_shards_looked_up=True)
        scanned = await read_routing_rows(db, within_s=5.0, first_shards_looked_up=False)
        chosen = await read_routing_rows(db, within_s=5.0)
    finally:
        await db.close()
        await engine.dispose()

    assert (short_history, long_history) == (False, True)
    assert [r.replica_id for r in _by_replica(looked_up.routes)] == ["llama-1", "llama-2"]
    assert _by_replica(looked_up.routes) == _by_replica(scanned.routes)
    assert _by_replica(chosen.routes) == _by_replica(scanned.routes)
    assert {r.agent_address for r in looked_up.routes} == {"127.0.0.2"}


async def _append(store: PostgresEventStore, batch: list[AnyEvent]) -> None:
    await store.append_many(
        [AppendRequest(stream_for(e), None, [NewEvent(e)]) for e in batch], META
    )
