"""Applying bench results over the admin API, as ``llmgw-cli bench`` does through
``cli.tuning.tune``: the event in the operator's name, the ``routing_table`` view the
gateways read, and refusals that name the field and write nothing."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.domain.events import model_stream
from app.store.database import connection
from app.store.postgres import PostgresEventStore
from cli.client import AdminClient, ApiProblem
from cli.config import ConnectionSettings
from cli.tuning import tune
from tests.support.admin_server import (
    last_position,
    seed_node,
    seed_serving_replica,
    serving_admin,
)

TOKEN = secrets.token_hex(16)
OPERATOR = "alice"
SPEC = {"command": "vllm serve {model} --port {port}", "replicas": 2}
MEASURED: dict[str, Any] = {"weight": 2.5, "target_waiting": 12, "kv_ceiling": 0.9}
SUMMARY = {"capacity_concurrency": 24, "slo": {"p95_ttft_s": 0.5}}


@pytest_asyncio.fixture(loop_scope="session")
async def admin_url(pg_store: PostgresEventStore) -> AsyncIterator[str]:
    async with serving_admin(pg_store, tokens={TOKEN: OPERATOR}) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def admin(admin_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=admin_url, headers=headers) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def serving_llama(admin: httpx.AsyncClient, pg_store: PostgresEventStore) -> str:
    """llama declared, with llama-1 and llama-2 serving; returns the node's id."""
    node_id = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node_id)
    assert (await admin.put("/admin/v1/models/llama", json=SPEC)).status_code == 200
    await seed_serving_replica(pg_store, "llama-1", node_id)
    await seed_serving_replica(pg_store, "llama-2", node_id)
    return node_id


async def routing_table(store: PostgresEventStore) -> dict[str, tuple[float, int, float]]:
    async with connection(store.engine) as db:
        rows = await db.fetch(
            "SELECT replica_id, weight, target_waiting, kv_ceiling FROM routing_table"
        )
    return {r["replica_id"]: (r["weight"], r["target_waiting"], r["kv_ceiling"]) for r in rows}


@pytest.mark.usefixtures("serving_llama")
async def test_tuning_a_model_routes_every_replica_by_it_in_the_operators_name(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    answer = await admin.post(
        "/admin/v1/models/llama/tuning", json={**MEASURED, "summary": SUMMARY}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "changed": True,
        "model": "llama",
        "replica_id": None,
        "routing": MEASURED,
    }
    tuned = (await pg_store.read_stream(model_stream("llama")))[-1]
    assert (tuned.event.__class__.__name__, tuned.meta.actor) == ("ModelTuned", OPERATOR)
    assert await routing_table(pg_store) == {
        "llama-1": (2.5, 12, 0.9),
        "llama-2": (2.5, 12, 0.9),
    }
    model = (await admin.get("/admin/v1/models/llama")).json()
    assert model["spec"]["routing"] == MEASURED


@pytest.mark.usefixtures("serving_llama")
async def test_tuning_one_replica_changes_its_route_alone(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    answer = await admin.post(
        "/admin/v1/models/llama/tuning", json={**MEASURED, "replica_id": "llama-2"}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["routing"] == MEASURED
    assert await routing_table(pg_store) == {
        "llama-1": (1.0, 5, 0.8),
        "llama-2": (2.5, 12, 0.9),
    }
    history = (await admin.get("/admin/v1/history/replica/llama-2")).json()["events"]
    assert [(e["type"], e["actor"]) for e in history][-1] == ("model_tuned", OPERATOR)


@pytest.mark.usefixtures("serving_llama")
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({**MEASURED, "weight": 0}, 422, "weight"),
        ({**MEASURED, "target_waiting": 0}, 422, "target_waiting"),
        ({**MEASURED, "target_waiting": 2**40}, 422, "target_waiting"),
        ({**MEASURED, "kv_ceiling": 1.5}, 422, "kv_ceiling"),
        ({**MEASURED, "replica_id": "llama-7"}, 422, "replica_id"),
        ({**MEASURED, "summary": {"blob": "x" * 70_000}}, 422, "summary"),
        ({**MEASURED, "summary": {**SUMMARY, "capacity": 1e-200}}, 422, "summary.capacity"),
        ({**MEASURED, "summary": {**SUMMARY, "capacity": 0}}, 422, "summary.capacity"),
        ({**MEASURED, "summary": {**SUMMARY, "capacity": "16"}}, 422, "summary.capacity"),
        ({**MEASURED, "weight": "heavy"}, 400, "weight"),
        ({**MEASURED, "speed": 3}, 400, "speed"),
        ({"weight": 1.0}, 400, "target_waiting"),
    ],
)
async def test_invalid_settings_are_refused_naming_the_field_and_write_nothing(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    body: dict[str, Any],
    status: int,
    field: str,
) -> None:
    before = await last_position(pg_store)

    answer = await admin.post("/admin/v1/models/llama/tuning", json=body)

    assert answer.status_code == status, answer.text
    assert field in answer.text
    assert await last_position(pg_store) == before


async def test_an_unknown_model_is_not_found(admin: httpx.AsyncClient) -> None:
    answer = await admin.post("/admin/v1/models/nonesuch/tuning", json=MEASURED)

    assert answer.status_code == 404
    assert answer.json()["detail"] == "no model 'nonesuch' is known"


@pytest.mark.usefixtures("serving_llama")
async def test_the_cli_client_applies_bench_results_once(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    settings = ConnectionSettings(admin_url=admin_url, token=TOKEN)

    def tune_twice() -> list[bool]:
        with AdminClient(settings) as client:
            return [
                tune(
                    client, "llama", weight=3.0, target_waiting=7, kv_ceiling=0.85, summary=SUMMARY
                ).changed
                for _ in range(2)
            ]

    assert await asyncio.to_thread(tune_twice) == [True, False]
    assert (await routing_table(pg_store))["llama-1"] == (3.0, 7, 0.85)


@pytest.mark.usefixtures("serving_llama")
async def test_the_cli_client_reports_a_refusal_with_its_fields(admin_url: str) -> None:
    settings = ConnectionSettings(admin_url=admin_url, token=TOKEN)

    def tune_badly() -> None:
        with AdminClient(settings) as client:
            tune(client, "llama", weight=-1, target_waiting=7, kv_ceiling=0.85)

    with pytest.raises(ApiProblem) as refused:
        await asyncio.to_thread(tune_badly)

    assert refused.value.status == 422
    assert "weight: must be between 0.001 and 1000000" in str(refused.value)


async def test_settings_bench_measured_on_a_revision_the_model_left_are_refused(
    admin: httpx.AsyncClient, admin_url: str, pg_store: PostgresEventStore
) -> None:
    model = f"mistral-{secrets.token_hex(3)}"
    assert (await admin.put(f"/admin/v1/models/{model}", json=SPEC)).status_code == 200
    moved = {**SPEC, "command": "sglang serve {model} --port {port}"}
    assert (await admin.put(f"/admin/v1/models/{model}", json=moved)).status_code == 200
    settings = ConnectionSettings(admin_url=admin_url, token=TOKEN)
    before = await last_position(pg_store)

    def tune_at(revision: int) -> bool:
        with AdminClient(settings) as client:
            return tune(client, model, **MEASURED, summary=SUMMARY, revision=revision).changed

    with pytest.raises(ApiProblem) as refused:
        await asyncio.to_thread(tune_at, 1)

    assert refused.value.status == 422
    assert "revision: bench measured revision 1 of the model; it is at revision 2" in str(
        refused.value
    )
    assert await last_position(pg_store) == before
    assert await asyncio.to_thread(tune_at, 2) is True
