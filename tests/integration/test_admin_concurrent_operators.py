"""Operators (or their scripts) changing one thing at the same moment through the admin
API, served over real HTTP against a fresh PostgreSQL database per test: every answer is a
change made or a 409 naming the change it met, never a 500, and the log ends as some serial
order of the requests would have left it."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest_asyncio

from app.domain.events import ModelScaled, model_stream
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, serving_admin

TOKENS = {secrets.token_hex(16): "alice", secrets.token_hex(16): "bob"}
OPERATORS = 30


@pytest_asyncio.fixture(loop_scope="session")
async def admin_url(pg_store: PostgresEventStore) -> AsyncIterator[str]:
    async with serving_admin(pg_store, tokens=TOKENS) as url:
        yield url


async def test_scales_at_once_leave_one_asked_count_and_each_refusal_names_what_it_met(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    alice, bob = (bearer_client(admin_url, token) for token in TOKENS)
    async with alice, bob:
        spec = {"command": "vllm serve {model} --port {port}", "replicas": 1}
        assert (await alice.put("/admin/v1/models/llama", json=spec)).status_code == 200

        answers = await asyncio.gather(
            *(
                (alice if n % 2 else bob).post(
                    "/admin/v1/models/llama/scale", json={"replicas": 2 + n}
                )
                for n in range(OPERATORS)
            )
        )

        assert {a.status_code for a in answers} <= {200, 409}
        for refused in (a.json() for a in answers if a.status_code == 409):
            assert refused["title"] == "conflict"
            met = refused["conflicts_with"]
            assert met, refused
            assert all(m["stream"] == "model-llama" for m in met)
            assert all(m["actor"] in ("alice", "bob") for m in met)
            assert met[-1]["summary"] in refused["detail"]
        model = (await alice.get("/admin/v1/models/llama")).json()
    scales = [
        r
        for r in await pg_store.read_stream(model_stream("llama"))
        if isinstance(r.event, ModelScaled)
    ]
    accepted = sum(1 for a in answers if a.status_code == 200)
    assert len(scales) == accepted  # every change answered 200 is recorded, no other
    last = scales[-1]
    assert isinstance(last.event, ModelScaled)
    assert model["desired"] == last.event.replicas  # the last recorded says who set it
    assert last.event.replicas in range(2, 2 + OPERATORS)
