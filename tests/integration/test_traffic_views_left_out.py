"""An operator reading a model's traffic at the admin API over PostgreSQL is told when a
crowded gateway's report may have left its replicas out (``unlisted``): the figures of its
revision and of its replica then may lack what that gateway sent them, while the figures
every report lists in full say 0."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.events import ModelDeclared, ReplicaPlaced, ShardPlacement
from app.domain.model_spec import ModelSpec
from app.domain.traffic import ReplicaTraffic
from app.domain.traffic_left_out import LeftOut
from app.store.database import connection
from app.store.gateway_reports import TrafficReport, write_report
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, record, seed_node, serving_admin

TOKEN = secrets.token_hex(16)


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def declared_with_a_replica(store: PostgresEventStore, model: str, node_id: str) -> str:
    replica_id = f"{model}-1"
    shard = ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20000)
    spec = ModelSpec(name=model, command="sim --port {port}", replicas=1)
    await record(store, "alice", ModelDeclared(model=model, spec=spec))
    await record(
        store,
        "reconciler",
        ReplicaPlaced(replica_id=replica_id, model=model, number=1, shards=(shard,), revision=1),
    )
    return replica_id


async def test_the_traffic_views_say_how_many_gateways_reports_may_have_left_replicas_out(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    node_id = f"gpu-{uuid.uuid4().hex[:8]}"
    quiet, busy = f"quiet-{uuid.uuid4().hex[:6]}", f"busy-{uuid.uuid4().hex[:6]}"
    await seed_node(pg_store, node_id)
    quiet_replica = await declared_with_a_replica(pg_store, quiet, node_id)
    busy_replica = await declared_with_a_replica(pg_store, busy, node_id)
    listing_all, crowded = f"listing-all-{quiet}", f"crowded-{quiet}"
    reports = {
        # Lists every replica it served: no figure of it is missing.
        listing_all: TrafficReport(
            window_s=60.0,
            replicas={quiet_replica: ReplicaTraffic(requests=3), busy_replica: ReplicaTraffic()},
        ),
        # Served the quiet model too, but among replicas its report had no room for.
        crowded: TrafficReport(
            window_s=60.0,
            replicas={busy_replica: ReplicaTraffic(requests=900)},
            left_out=LeftOut(replicas=1, models=frozenset({quiet})),
        ),
    }
    try:
        async with connection(engine) as db:
            for gateway_id, traffic in reports.items():
                await write_report(
                    db, gateway_id, {}, within_s=5.0, instance="test", traffic=traffic
                )

        quiet_model = (await admin.get(f"/admin/v1/models/{quiet}")).json()
        quiet_view = (await admin.get(f"/admin/v1/replicas/{quiet_replica}")).json()
        busy_model = (await admin.get(f"/admin/v1/models/{busy}")).json()
        busy_view = (await admin.get(f"/admin/v1/replicas/{busy_replica}")).json()
    finally:  # gone, as their gateways stopped: no other story reads them as live
        async with connection(engine) as db:
            await db.execute(
                "DELETE FROM gateway_reports WHERE gateway_id = ANY($1::text[])", list(reports)
            )

    partial = quiet_model["traffic_by_revision"]["1"]
    assert (partial["requests"], partial["gateways"], partial["unlisted"]) == (3, 2, 1)
    traffic = quiet_view["traffic"]
    assert (traffic["requests"], traffic["gateways"], traffic["unlisted"]) == (3, 2, 1)
    whole = busy_model["traffic_by_revision"]["1"]
    assert (whole["requests"], whole["unlisted"]) == (900, 0)
    assert (busy_view["traffic"]["requests"], busy_view["traffic"]["unlisted"]) == (900, 0)


async def test_the_schema_says_every_traffic_view_carries_unlisted(
    admin: httpx.AsyncClient,
) -> None:
    schema = (await admin.get("/admin/v1/schema/openapi.json")).json()

    [view] = [
        shape
        for name, shape in schema["components"]["schemas"].items()
        if name.endswith("ReplicaTrafficView")
    ]
    assert view["properties"]["unlisted"]["type"] == "integer"
    assert "unlisted" in view["required"]
