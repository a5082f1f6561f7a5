"""Changes sent again with their ``Idempotency-Key``: the admin API served over a real
PostgreSQL store records each once and answers the repeat as it answered the first; a key
sent again with another request, or malformed, is refused and records nothing."""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest

from app.domain.events import (
    ApiKeyCreated,
    ModelScaled,
    NodeCordoned,
    NodeDrainRequested,
    model_stream,
    node_stream,
)
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, seed_node
from tests.support.routing import declare_model
from tests.support.two_operators import BOB_TOKEN


def keyed(key: str) -> dict[str, str]:
    return {"idempotency-key": key}


async def drains_of(store: PostgresEventStore, node: str) -> list[NodeDrainRequested]:
    return [
        r.event
        for r in await store.read_stream(node_stream(node))
        if isinstance(r.event, NodeDrainRequested)
    ]


async def scales_of(store: PostgresEventStore, model: str) -> list[int]:
    return [
        r.event.replicas
        for r in await store.read_stream(model_stream(model))
        if isinstance(r.event, ModelScaled)
    ]


async def test_a_drain_sent_again_with_its_key_is_recorded_once_and_answered_alike(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    node = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node)
    key = secrets.token_hex(16)

    first = await alice.post(f"/admin/v1/nodes/{node}/drain", json={}, headers=keyed(key))
    again = await alice.post(f"/admin/v1/nodes/{node}/drain", json={}, headers=keyed(key))

    assert first.status_code == again.status_code == 202, again.text
    [requested] = await drains_of(pg_store, node)
    assert first.json()["drain_id"] == again.json()["drain_id"] == requested.drain_id
    assert again.json()["progress"] == f"/admin/v1/drains/{requested.drain_id}"


async def test_a_scale_sent_again_with_its_key_answers_changed_as_the_first_did(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    await declare_model(pg_store, model, replicas=1)
    key = secrets.token_hex(16)
    scale = f"/admin/v1/models/{model}/scale"

    first = await alice.post(scale, json={"replicas": 3}, headers=keyed(key))
    again = await alice.post(scale, json={"replicas": 3}, headers=keyed(key))
    without_key = await alice.post(scale, json={"replicas": 3})

    assert first.json()["changed"] is again.json()["changed"] is True
    assert without_key.json()["changed"] is False
    assert await scales_of(pg_store, model) == [3]


async def test_a_key_sent_again_with_another_request_is_refused_and_records_nothing(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    await declare_model(pg_store, model, replicas=1)
    node = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node)
    key = secrets.token_hex(16)
    scale = f"/admin/v1/models/{model}/scale"
    assert (await alice.post(scale, json={"replicas": 3}, headers=keyed(key))).status_code == 200

    other_body = await alice.post(scale, json={"replicas": 5}, headers=keyed(key))
    other_endpoint = await alice.post(
        f"/admin/v1/nodes/{node}/cordon", json={"reason": "disk"}, headers=keyed(key)
    )

    for refused in (other_body, other_endpoint):
        assert refused.status_code == 422, refused.text
        assert refused.json()["title"] == "idempotency-key-reused"
        assert (
            f"the Idempotency-Key '{key}' was sent before with another request"
            in (refused.json()["detail"])
        )
    assert await scales_of(pg_store, model) == [3]
    node_events = await pg_store.read_stream(node_stream(node))
    assert not [r for r in node_events if isinstance(r.event, NodeCordoned)]


async def test_the_same_key_from_two_operators_is_two_changes(
    admin_url: str, alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    await declare_model(pg_store, model, replicas=1)
    key = secrets.token_hex(16)
    scale = f"/admin/v1/models/{model}/scale"

    async with bearer_client(admin_url, BOB_TOKEN) as bob:
        by_alice = await alice.post(scale, json={"replicas": 3}, headers=keyed(key))
        by_bob = await bob.post(scale, json={"replicas": 4}, headers=keyed(key))

    assert by_alice.json()["changed"] is by_bob.json()["changed"] is True
    assert await scales_of(pg_store, model) == [3, 4]


@pytest.mark.parametrize(
    "sent",
    [["has space"], ["x" * 129], [""], ["ключ"], ["one", "two"]],
    ids=["space", "too-long", "empty", "not-ascii", "twice"],
)
async def test_a_malformed_key_is_refused_naming_the_header_and_records_nothing(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore, sent: list[str]
) -> None:
    model = f"llama-{secrets.token_hex(3)}"
    await declare_model(pg_store, model, replicas=1)
    headers = [("idempotency-key", value.encode()) for value in sent]

    refused = await alice.post(
        f"/admin/v1/models/{model}/scale", json={"replicas": 3}, headers=headers
    )

    assert refused.status_code == 400, refused.text
    assert "the Idempotency-Key header" in refused.json()["detail"]
    assert await scales_of(pg_store, model) == []


async def test_a_key_creation_sent_again_names_the_key_whose_secret_was_shown_once(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    name = f"ci-{secrets.token_hex(3)}"
    key = secrets.token_hex(16)
    body = {"name": name, "models": ["*"]}

    first = await alice.post("/admin/v1/keys", json=body, headers=keyed(key))
    again = await alice.post("/admin/v1/keys", json=body, headers=keyed(key))

    assert first.status_code == 201, first.text
    assert again.status_code == 409, again.text
    assert again.json()["title"] == "carried-out-already"
    assert again.json()["key_id"] == first.json()["id"]
    assert "whose secret was shown only in that answer" in again.json()["detail"]
    created = [
        r.event
        for r in await pg_store.read_all(0, 10_000)
        if isinstance(r.event, ApiKeyCreated) and r.event.name == name
    ]
    assert len(created) == 1


async def test_a_revocation_by_name_sent_again_answers_the_key_it_revoked(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    name = f"ci-{secrets.token_hex(3)}"
    body = {"name": name, "models": ["*"]}
    revoked = (await alice.post("/admin/v1/keys", json=body)).json()["id"]
    key = secrets.token_hex(16)
    first = await alice.delete(f"/admin/v1/keys/{name}", headers=keyed(key))
    created_since = (await alice.post("/admin/v1/keys", json=body)).json()["id"]

    again = await alice.delete(f"/admin/v1/keys/{name}", headers=keyed(key))

    assert first.json()["key"]["id"] == again.json()["key"]["id"] == revoked
    assert again.json()["changed"] is True
    listed = {k["id"]: k for k in (await alice.get("/admin/v1/keys")).json()}
    assert listed[revoked]["revoked"] is True
    assert listed[created_since]["revoked"] is False


async def test_one_key_sent_twice_at_once_records_one_drain(
    alice: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    node = f"gpu-{secrets.token_hex(3)}"
    await seed_node(pg_store, node)
    key = secrets.token_hex(16)
    path = f"/admin/v1/nodes/{node}/drain"

    answers = await asyncio.gather(
        *(alice.post(path, json={}, headers=keyed(key)) for _ in range(4))
    )

    [requested] = await drains_of(pg_store, node)
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    assert {a.json()["drain_id"] for a in answers} == {requested.drain_id}
