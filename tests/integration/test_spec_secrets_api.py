"""Secrets in a model spec at the admin API, on a real server and PostgreSQL: a spec that
carries one inline is refused and nothing is recorded; one recorded before the rule (as an
older release accepted it) keeps running, but no answer shows its secret."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from app.domain.events import ModelDeclared, model_stream
from app.domain.model_spec import ModelSpec
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import (
    bearer_client,
    last_position,
    problem_of,
    record,
    serving_admin,
)

TOKEN = secrets.token_hex(16)
SECRET = f"hf_{secrets.token_hex(12)}"


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def test_a_spec_with_a_secret_inline_is_a_422_naming_it_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    name = f"llama-{secrets.token_hex(3)}"
    before = await last_position(pg_store)

    answer = await admin.put(
        f"/admin/v1/models/{name}",
        json={
            "command": f"llama-server -m {{model}} --port {{port}} --api-key {SECRET}",
            "env": {"HF_TOKEN": SECRET, "HF_HOME": "/models"},
        },
    )

    problem = problem_of(answer, 422)
    assert [e["field"] for e in problem["errors"]] == ["env.HF_TOKEN", "command"]
    assert "set HF_TOKEN in the agent's environment on the nodes" in answer.text
    assert "--api-key a value inline" in answer.text
    assert SECRET not in answer.text
    assert await last_position(pg_store) == before


async def test_a_secret_an_older_release_recorded_is_withheld_from_every_answer(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    name = f"llama-{secrets.token_hex(3)}"
    spec = ModelSpec(
        name=name,
        command=f"llama-server -m {{model}} --port {{port}} --api-key={SECRET}",
        env={"HF_TOKEN": SECRET, "HF_HOME": "/models"},
    )
    await record(pg_store, "alice", ModelDeclared(model=name, spec=spec))

    model = await admin.get(f"/admin/v1/models/{name}")
    models = await admin.get("/admin/v1/models")
    history = await admin.get(f"/admin/v1/history/model/{name}")
    events = await admin.get("/admin/v1/events", params={"follow": "false", "limit": 1000})

    assert model.status_code == 200, model.text
    shown = model.json()["spec"]
    assert shown["env"] == {"HF_TOKEN": "(withheld)", "HF_HOME": "/models"}
    assert shown["command"] == "llama-server -m {model} --port {port} --api-key=(withheld)"
    for answer in (model, models, history, events):
        assert answer.status_code == 200, answer.text
        assert SECRET not in answer.text
    assert name in history.text
    assert name in events.text
    stored = [e.event for e in await pg_store.read_stream(model_stream(name))]
    assert [e.spec.env["HF_TOKEN"] for e in stored if isinstance(e, ModelDeclared)] == [SECRET]
