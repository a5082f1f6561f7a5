"""`llmgw-cli forget` against a live admin API on PostgreSQL: a retired node refused while
anything depends on it, then forgotten for good, its history kept, the projection agreeing
with a rebuild, and its id registered anew when an agent connects under it again."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from app.domain.events import (
    GpuCordoned,
    NodeDisconnected,
    ReplicaStopped,
    ReplicaStopping,
    node_stream,
)
from app.domain.state import revocation_key
from app.store.postgres import PostgresEventStore
from app.store.rebuild import rebuild
from tests.support.admin_server import (
    bearer_client,
    last_position,
    problem_of,
    record,
    seed_node,
    seed_serving_replica,
    serving_admin,
)
from tests.support.operator_cli import OPERATOR, Operator

pytestmark = pytest.mark.timeout(120)

TOKEN = secrets.token_hex(16)


async def nodes_rows(store: PostgresEventStore, node_id: str) -> int:
    async with store.engine.connect() as conn:
        found = await conn.exec_driver_sql("SELECT count(*) FROM nodes WHERE id = $1", (node_id,))
        return int(found.scalar_one())


async def test_a_retired_node_is_refused_until_free_then_forgotten_for_good(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = f"gpu-{secrets.token_hex(3)}"
    replica = f"llama-{secrets.token_hex(3)}-1"
    await seed_node(pg_store, node)
    await seed_serving_replica(pg_store, replica, node)
    await record(pg_store, OPERATOR, GpuCordoned(node_id=node, gpu_index=1, reason="ECC"))
    before = await last_position(pg_store)

    busy = await operator.run("forget", node, "--reason", "returned to the cloud")

    assert busy.code == 1, busy.stdout
    assert "it is connected" in busy.stderr
    assert f"1 replica(s) not ended have a shard on it ({replica})" in busy.stderr
    assert await last_position(pg_store) == before

    await record(pg_store, f"agent:{node}", NodeDisconnected(node_id=node, reason="stopped"))
    await record(pg_store, "reconciler", ReplicaStopping(replica_id=replica, reason="drained"))
    await record(pg_store, "reconciler", ReplicaStopped(replica_id=replica))
    forgotten = await operator.run(
        "forget", node, "--reason", "returned to the cloud", "--revoke-certificates"
    )

    assert forgotten.code == 0, forgotten.stderr
    assert forgotten.stdout == f"node {node}: forgotten and its certificates revoked\n"
    recorded = (await pg_store.read_stream(node_stream(node)))[-2:]
    assert [(type(r.event).__name__, r.meta.actor) for r in recorded] == [
        ("CertificateRevoked", OPERATOR),
        ("NodeForgotten", OPERATOR),
    ]
    assert {getattr(r.event, "reason", None) for r in recorded} == {"returned to the cloud"}
    listed = await operator.run("nodes", "--output", "json")
    assert node not in {n["id"] for n in listed.json()}
    shown = await operator.run("node", node)
    assert shown.code == 1
    assert f"no node '{node}' is known" in shown.stderr
    assert await nodes_rows(pg_store, node) == 0
    assert (await rebuild(pg_store.engine, verify=True)).differences == []

    history = await operator.run("history", "node", node)
    assert history.code == 0, history.stderr
    assert "forgotten for good: returned to the cloud" in history.stdout
    assert OPERATOR in history.stdout
    ran_there = await operator.run("replica", replica, "--output", "json")
    assert ran_there.json()["shards"][0]["node_id"] == node
    again = await operator.run("forget", node, "--reason", "returned to the cloud")
    assert again.code == 1
    assert f"no node '{node}' is known" in again.stderr

    # Its certificates are revoked, but one issued later (or none revoked) connects: then
    # the node is new, with nothing of the old one (its GPU's cordon is gone).
    assert revocation_key(None, node) in pg_store.state.revocations
    await seed_node(pg_store, node)
    back = await operator.run("node", node, "--output", "json")
    assert [g["cordoned"] for g in back.json()["gpus"]] == [False, False]
    assert await nodes_rows(pg_store, node) == 1


async def test_a_forget_without_a_reason_is_bad_usage_and_sends_nothing(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    before = await last_position(pg_store)

    blank = await operator.run("forget", "gpu-1", "--reason", "  ")
    missing = await operator.run("forget", "gpu-1")

    assert (blank.code, missing.code) == (2, 2)
    assert "--reason must say why the node is forgotten" in blank.stderr
    assert await last_position(pg_store) == before


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: OPERATOR}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def test_the_admin_api_answers_each_refusal_with_its_problem_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    node = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node)
    before = await last_position(pg_store)
    path = f"/admin/v1/nodes/{node}/forget"

    connected = await admin.post(path, json={"reason": "retired"})
    unknown = await admin.post("/admin/v1/nodes/gpu-nowhere/forget", json={"reason": "retired"})
    no_reason = await admin.post(path, json={"reason": ""})
    no_body = await admin.post(path)
    unknown_field = await admin.post(path, json={"reason": "retired", "force": True})

    refusal = problem_of(connected, 409)
    assert refusal["type"].endswith("invalid-operation"), refusal
    assert "stop its agent first" in refusal["detail"]
    assert problem_of(unknown, 404)["type"].endswith("unknown-node")
    assert problem_of(no_reason, 422)["type"].endswith("invalid-text")
    assert no_body.status_code == 400, no_body.text
    assert unknown_field.status_code == 400, unknown_field.text
    assert await last_position(pg_store) == before
