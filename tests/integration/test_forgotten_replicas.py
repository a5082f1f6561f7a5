"""Replicas the fold forgot, at the admin API over PostgreSQL: every answer about them is the
one given while the fold still kept them, the tables keep their rows, and a rebuild of the
projection from the log agrees."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaStopped,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
)
from app.domain.model_spec import ModelSpec
from app.domain.state import ENDED_KEPT_PER_MODEL
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from app.store.projection import all_rows
from app.store.rebuild import rebuild
from app.store.replay import replay
from tests.support.admin_server import bearer_client, record, seed_node, serving_admin, stream_of

TOKEN = secrets.token_hex(16)
K = ENDED_KEPT_PER_MODEL


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


def lived_and_ended(number: int) -> list[AnyEvent]:
    """A replica that came up; odd ones failed with a log tail, even ones were stopped."""
    replica_id = f"llama-{number}"
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000 + number)
    events: list[AnyEvent] = [
        ReplicaPlaced(replica_id=replica_id, model="llama", number=number, shards=(shard,)),
        ShardStarting(replica_id=replica_id, shard_index=0, node_id="gpu-1", pid=number),
        ShardReady(replica_id=replica_id, shard_index=0, node_id="gpu-1"),
    ]
    if number % 2:
        events += [
            ShardFailed(
                replica_id=replica_id,
                shard_index=0,
                node_id="gpu-1",
                error="CUDA out of memory",
                exit_code=1,
                log_tail=("loading", "OOM"),
            ),
            ReplicaFailed(replica_id=replica_id, reason="shard 0 on gpu-1 failed"),
        ]
    else:
        events.append(ReplicaStopped(replica_id=replica_id))
    return events


async def answers(admin: httpx.AsyncClient) -> dict[str, Any]:
    async def get(path: str) -> Any:
        response = await admin.get(path)
        response.raise_for_status()
        return response.json()

    return {
        "list": await get("/admin/v1/replicas"),
        "failed": await get("/admin/v1/replicas?phase=failed&model=llama"),
        "on gpu-1": await get("/admin/v1/replicas?node=gpu-1"),
        "llama-1": await get("/admin/v1/replicas/llama-1"),
        "llama-2": await get("/admin/v1/replicas/llama-2"),
        "history": await get("/admin/v1/history/replica/llama-1"),
    }


async def test_forgotten_replicas_answer_as_they_did_and_keep_their_rows(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    await seed_node(pg_store, "gpu-1")
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=0)
    await record(pg_store, "alice", ModelDeclared(model="llama", spec=spec))
    for number in range(1, K + 1):
        await record(pg_store, "reconciler", *lived_and_ended(number))
    before = await answers(admin)

    await record(pg_store, "reconciler", *lived_and_ended(K + 1), *lived_and_ended(K + 2))
    assert "llama-1" not in pg_store.state.replicas
    assert "llama-2" not in pg_store.state.replicas
    after = await answers(admin)

    newer = {f"llama-{K + 1}", f"llama-{K + 2}"}
    assert [r for r in after["list"] if r["id"] not in newer] == before["list"]
    assert [r for r in after["failed"] if r["id"] not in newer] == before["failed"]
    assert [r for r in after["on gpu-1"] if r["id"] not in newer] == before["on gpu-1"]
    assert after["llama-1"] == before["llama-1"]
    assert after["llama-1"]["shards"][0]["log_tail"] == ["loading", "OOM"]
    assert after["llama-2"] == before["llama-2"]
    assert after["history"] == before["history"]
    models = (await admin.get("/admin/v1/models/llama")).json()
    assert models["phases"] == {"failed": (K + 2) // 2, "stopped": (K + 2) // 2}

    report = await rebuild(engine, verify=True)
    assert report.differences == []
    assert report.rows["replicas"] == K + 2
    assert all_rows(pg_store.state) == all_rows(await replay(engine))


async def test_a_filter_no_stored_id_can_hold_finds_no_replica_rather_than_failing(
    admin: httpx.AsyncClient,
) -> None:
    """PostgreSQL text cannot hold a NUL: the rows of forgotten replicas are not asked."""
    for query in ("node=gpu-1%00", "model=llama%00x", "node=a%00&phase=stopped"):
        response = await admin.get(f"/admin/v1/replicas?{query}")

        assert response.status_code == 200, response.text
        assert response.json() == []


async def test_a_replica_changed_or_placed_then_forgotten_in_one_append_keeps_its_last_rows(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, engine: AsyncEngine
) -> None:
    """The rows of a replica the fold forgets are those it had when forgotten, whether the
    append that forgot it also changed it (a late stop of an ended replica) or placed it."""
    await seed_node(pg_store, "gpu-1")
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=0)
    await record(pg_store, "alice", ModelDeclared(model="llama", spec=spec))
    for number in range(1, K + 1):
        await record(pg_store, "reconciler", *lived_and_ended(number))

    late_stop = ShardStopped(replica_id="llama-2", shard_index=0, node_id="gpu-1", exit_code=143)
    one_append = [late_stop] + [e for n in range(K + 1, 2 * K + 2) for e in lived_and_ended(n)]
    await pg_store.append_many(
        [AppendRequest(stream_of(e), None, [NewEvent(e)]) for e in one_append],
        Meta(actor="reconciler"),
    )
    assert "llama-2" not in pg_store.state.replicas
    assert f"llama-{K + 1}" not in pg_store.state.replicas, "placed and forgotten at once"

    stopped_late = (await admin.get("/admin/v1/replicas/llama-2")).json()
    assert stopped_late["shards"][0]["exit_code"] == 143
    placed_and_forgotten = await admin.get(f"/admin/v1/replicas/llama-{K + 1}")
    assert placed_and_forgotten.json()["phase"] == "failed"
    report = await rebuild(engine, verify=True)
    assert report.differences == []
    assert report.rows["replicas"] == 2 * K + 1
