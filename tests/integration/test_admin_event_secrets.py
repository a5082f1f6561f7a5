"""No answer of the admin API shows a key's secret hash: the log keeps it, for the gateway
to check keys against, and nobody who can read the history gets it (with it, guesses of a
key could be checked offline).

A key is created through the API on a real server over a fresh PostgreSQL database; then
every route that renders events (a page of the log, the live stream, an entity's history,
a drain's progress) and every route that renders keys is read, and none holds the hash.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from app.domain.events import ApiKeyCreated, key_stream
from app.domain.keys import hash_key
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, seed_node, serving_admin

TOKEN = secrets.token_hex(16)
DEADLINE_S = 10.0


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def created_key(
    admin: httpx.AsyncClient, store: PostgresEventStore, request_id: str
) -> tuple[dict[str, Any], str]:
    """A key created with ``request_id`` as its correlation id, and its hash as the log
    holds it."""
    answer = await admin.post(
        "/admin/v1/keys",
        json={"name": "ci", "models": ["*"]},
        headers={"x-request-id": request_id},
    )
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    [recorded] = await store.read_stream(key_stream(created["id"]))
    assert isinstance(recorded.event, ApiKeyCreated)
    assert recorded.event.secret_hash == hash_key(created["key"])
    return created, recorded.event.secret_hash


async def streamed_until_key(admin: httpx.AsyncClient, key_id: str) -> str:
    """The live stream from the start of the log, read up to the key's creation."""
    seen: list[str] = []
    async with (
        asyncio.timeout(DEADLINE_S),
        admin.stream("GET", "/admin/v1/events", params={"since": 0}) as answer,
    ):
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            seen.append(line)
            if line.startswith("data:") and key_id in line:
                break
    return "\n".join(seen)


async def test_no_route_that_renders_events_or_keys_shows_a_secret_hash(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, "gpu-1")
    drain = await admin.post("/admin/v1/nodes/gpu-1/drain", json={"grace_s": 60})
    assert drain.status_code == 202, drain.text
    drain_id = drain.json()["drain_id"]
    # Created under the drain's id, the key's event is one of the drain's events too.
    key, secret_hash = await created_key(admin, pg_store, request_id=drain_id)

    answers = {
        "events page": await admin.get("/admin/v1/events", params={"follow": "false"}),
        "history": await admin.get(f"/admin/v1/history/key/{key['id']}"),
        "drain progress": await admin.get(f"/admin/v1/drains/{drain_id}"),
        "keys": await admin.get("/admin/v1/keys"),
        "revoked": await admin.delete(f"/admin/v1/keys/{key['prefix']}"),
    }
    texts = {route: answer.text for route, answer in answers.items()}
    texts["event stream"] = await streamed_until_key(admin, key["id"])

    for route, answer in answers.items():
        assert answer.status_code == 200, (route, answer.text)
    for route, text in texts.items():
        assert key["prefix"] in text, route  # the key's event (or record) is there ...
        assert secret_hash not in text, route  # ... without its hash
        assert "secret_hash" not in text, route
    [shown] = [e for e in answers["history"].json()["events"] if e["type"] == "api_key_created"]
    assert shown["data"] == {
        "key_id": key["id"],
        "name": "ci",
        "prefix": key["prefix"],
        "models": [],
        "rpm": None,
        "tpm": None,
        "expires_at": None,
    }
