"""A model's traffic per revision at the admin API over PostgreSQL: what two gateways
reported of its active replicas, added up by the revision each replica runs, with the
gateways counted once."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from msgspec.structs import replace
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.events import ModelDeclared, ReplicaPlaced, ReplicaStopped, ShardPlacement
from app.domain.model_spec import ModelSpec
from app.domain.revisions import spec_changes
from app.domain.traffic import RESOLUTION, Histogram, ReplicaTraffic, add_sample
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


def placed(number: int, revision: int) -> ReplicaPlaced:
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(number,), port=20000 + number)
    return ReplicaPlaced(
        replica_id=f"llama-{number}",
        model="llama",
        number=number,
        shards=(shard,),
        revision=revision,
    )


def seen(
    requests: int, ttft_ms: float, errors: int = 0, cancelled: int = 0, abandoned: int = 0
) -> ReplicaTraffic:
    ttft: Histogram = {}
    for _ in range(requests - errors):
        add_sample(ttft, ttft_ms)
    return ReplicaTraffic(
        requests=requests, errors=errors, cancelled=cancelled, abandoned=abandoned, ttft=ttft
    )


async def test_a_models_traffic_is_added_up_per_revision_and_per_gateway_once(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    await seed_node(pg_store, "gpu-1")
    stable = ModelSpec(name="llama", command="sim --port {port}", replicas=0)
    canary = replace(stable, command="sim --port {port} --new-kernel")
    await record(pg_store, "alice", ModelDeclared(model="llama", spec=stable))
    await record(pg_store, "reconciler", placed(1, 1), placed(2, 1), placed(4, 1))
    changes = spec_changes(stable, canary)
    await record(
        pg_store, "alice", ModelDeclared(model="llama", spec=canary, revision=2, changes=changes)
    )
    await record(pg_store, "reconciler", placed(3, 2), ReplicaStopped(replica_id="llama-4"))
    async with connection(engine) as db:
        await write_report(
            db,
            "gateway-a",
            {},
            within_s=5.0,
            instance="test",
            traffic=TrafficReport(
                window_s=60.0,
                replicas={
                    "llama-1": seen(10, 100.0, errors=1, cancelled=1),
                    "llama-3": seen(4, 300.0, cancelled=3, abandoned=2),
                },
            ),
        )
        await write_report(
            db,
            "gateway-b",
            {},
            within_s=5.0,
            instance="test",
            traffic=TrafficReport(
                window_s=60.0,
                replicas={"llama-2": seen(10, 100.0), "llama-4": seen(50, 5.0, errors=50)},
            ),
        )

    model = (await admin.get("/admin/v1/models/llama")).json()

    by_revision = model["traffic_by_revision"]
    assert sorted(by_revision) == ["1", "2"]
    old, new = by_revision["1"], by_revision["2"]
    assert (old["requests"], old["errors"], old["gateways"]) == (20, 1, 2), "llama-4 ended"
    assert old["error_rate"] == 1 / 20
    assert (new["requests"], new["errors"], new["gateways"]) == (4, 0, 2)
    assert (old["cancelled"], old["abandoned"]) == (1, 0)
    assert (new["cancelled"], new["abandoned"]) == (3, 2), "clients gave up on the canary"
    assert abs(old["ttft_p95_ms"] - 100.0) <= 100.0 * RESOLUTION
    assert abs(new["ttft_p95_ms"] - 300.0) <= 300.0 * RESOLUTION
    listed = (await admin.get("/admin/v1/models")).json()
    assert [m["traffic_by_revision"] for m in listed] == [None]
