"""What a request says beyond its values, at the admin API: a field no request has, a body
sent where none is taken, a key written twice, a method or a path that is none of the API's.
The Litestar app served by uvicorn on a loopback socket, over real HTTP, against a fresh
PostgreSQL database per test.

Each was once answered as if it had not been sent (a misspelt ``require_rom`` drained a
node with no room to go to; the second ``replicas`` of two won), or with the router's bare
words (``Method Not Allowed``). Each now gets a 4xx naming what is wrong, and the log is
left as it was.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import (
    bearer_client,
    last_position,
    problem_of,
    seed_node,
    seed_serving_replica,
    serving_admin,
)

TOKEN = secrets.token_hex(16)
COMMAND = "vllm serve {model} --port {port}"


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


async def seeded(admin: httpx.AsyncClient, store: PostgresEventStore) -> int:
    """A node with a serving replica of a declared model; the log's position after them."""
    await seed_node(store, "gpu-1")
    declared = await admin.put("/admin/v1/models/llama", json={"command": COMMAND})
    assert declared.status_code == 200, declared.text
    await seed_serving_replica(store, "llama-1", "gpu-1")
    return await last_position(store)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/v1/nodes/gpu-1/drain", {"grace_s": 60, "require_rom": True}, "require_rom"),
        ("/admin/v1/nodes/gpu-1/cordon", {"reason": "ECC errors", "reasn": "x"}, "reasn"),
        ("/admin/v1/models/llama/scale", {"replicas": 2, "replica": 3}, "replica"),
    ],
    ids=["node drain", "cordon", "scale"],
)
async def test_a_field_the_request_does_not_have_is_a_400_naming_it(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post(path, json=body)

    problem = problem_of(answer, 400)
    assert problem["detail"] == f"(body): Object contains unknown field `{field}`"
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    "path",
    [
        "/admin/v1/nodes/gpu-1/uncordon",
        "/admin/v1/replicas/llama-1/drain",
        "/admin/v1/models/llama/rollout/resume",
    ],
    ids=["uncordon", "replica drain", "rollout resume"],
)
async def test_a_field_sent_to_a_request_that_takes_no_body_is_a_400(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, path: str
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post(path, json={"grace_s": 60})

    problem = problem_of(answer, 400)
    assert problem["detail"] == "(body): Object contains unknown field `grace_s`"
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    "path",
    [
        "/admin/v1/models/llama",
        "/admin/v1/models/llama/autoscale",
        "/admin/v1/keys/ci",
    ],
    ids=["model removal", "autoscale off", "key revocation"],
)
async def test_a_field_sent_to_a_delete_is_a_400_and_removes_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, path: str
) -> None:
    await seeded(admin, pg_store)
    created = await admin.post("/admin/v1/keys", json={"name": "ci", "models": ["llama"]})
    assert created.status_code == 201, created.text
    autoscaled = await admin.put("/admin/v1/models/llama/autoscale", json={"min": 1, "max": 2})
    assert autoscaled.status_code == 200, autoscaled.text
    before = await last_position(pg_store)

    answer = await admin.request("DELETE", path, json={"revoke_certificates": True})

    problem = problem_of(answer, 400)
    assert problem["detail"] == "(body): Object contains unknown field `revoke_certificates`"
    assert await last_position(pg_store) == before


async def test_an_empty_object_to_a_delete_is_read_as_none(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.request("DELETE", "/admin/v1/models/llama", json={})

    assert answer.status_code == 200, answer.text
    assert await last_position(pg_store) > before


async def test_an_empty_object_to_a_request_that_takes_no_body_is_read_as_none(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post("/admin/v1/replicas/llama-1/drain", json={})

    assert answer.status_code == 202, answer.text
    assert await last_position(pg_store) > before


@pytest.mark.parametrize(
    ("method", "path", "body", "key"),
    [
        ("POST", "/admin/v1/models/llama/scale", '{"replicas": 0, "replicas": 20}', "replicas"),
        (
            "POST",
            "/admin/v1/keys",
            '{"name": "ci", "models": ["llama"], "name": "admin"}',
            "name",
        ),
        (
            "POST",
            "/admin/v1/nodes/gpu-1/drain",
            '{"require_room": true, "require_room": false}',
            "require_room",
        ),
    ],
    ids=["scale", "key", "node drain"],
)
async def test_a_key_written_twice_is_a_400_naming_it(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    method: str,
    path: str,
    body: str,
    key: str,
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.request(method, path, content=body)

    problem = problem_of(answer, 400)
    reason = f"holds the key {key!r} twice in one object: which one is meant is not clear"
    assert problem["detail"] == f"the request body {reason}"
    assert problem["errors"] == [{"key": "(body)", "message": reason, "source": "body"}]
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", "/admin/v1/models/llama"), ("POST", "/admin/v1/models/llama/preview")],
    ids=["apply", "preview"],
)
async def test_a_spec_with_a_key_written_twice_is_a_422_naming_it(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, method: str, path: str
) -> None:
    before = await seeded(admin, pg_store)
    body = f'{{"command": "{COMMAND}", "routing": {{"weight": 1, "weight": 50}}}}'

    answer = await admin.request(method, path, content=body)

    problem = problem_of(answer, 422)
    assert problem["errors"] == [
        {
            "field": "(body)",
            "reason": "holds the key 'weight' twice in one object: which one is meant is not clear",
        }
    ]
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/admin/v1/models/llama", {"GET", "HEAD", "PUT", "DELETE", "OPTIONS"}),
        ("/admin/v1/models/llama/autoscale", {"PUT", "PATCH", "DELETE", "OPTIONS"}),
        ("/admin/v1/keys", {"GET", "HEAD", "POST", "OPTIONS"}),
        ("/admin/v1/nodes/gpu-1", {"GET", "HEAD", "OPTIONS"}),
    ],
    ids=["model", "autoscale", "keys", "node"],
)
async def test_options_names_every_method_of_the_path_as_a_405_does(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, path: str, methods: set[str]
) -> None:
    await seeded(admin, pg_store)

    options = await admin.options(path)
    refused = await admin.request("TRACE", path)

    assert options.status_code == 204, options.text
    assert set(options.headers["allow"].split(", ")) == methods
    assert set(refused.headers["allow"].split(", ")) == methods


async def test_a_method_a_path_does_not_take_is_a_405_naming_the_ones_it_does(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post("/admin/v1/nodes/gpu-1")

    problem = problem_of(answer, 405)
    allowed = answer.headers["allow"]
    assert "GET" in allowed
    assert problem["detail"] == f"POST is not a method of /admin/v1/nodes/gpu-1; it takes {allowed}"
    assert await last_position(pg_store) == before


async def test_a_path_that_is_none_of_the_apis_is_a_404_naming_it(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.delete("/admin/v1/models/llama/replicas")

    problem = problem_of(answer, 404)
    assert problem["detail"] == "no such path: /admin/v1/models/llama/replicas"
    assert await last_position(pg_store) == before


async def test_a_query_parameter_the_request_does_not_take_is_a_400_naming_it(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seeded(admin, pg_store)

    misspelt = await admin.get("/admin/v1/replicas", params={"modle": "other"})
    spelt = await admin.get("/admin/v1/replicas", params={"model": "other"})

    problem = problem_of(misspelt, 400)
    assert problem["detail"] == (
        "modle: not a query parameter of /admin/v1/replicas (it takes after, ended, limit, "
        "model, node, phase)"
    )
    assert problem["errors"] == [
        {"key": "modle", "message": "is not a query parameter of this request", "source": "query"}
    ]
    assert spelt.status_code == 200, spelt.text
    assert spelt.json() == []


async def test_a_query_parameter_given_twice_is_a_400_naming_it_not_one_value_picked(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    await seeded(admin, pg_store)

    twice = await admin.get("/admin/v1/replicas", params=[("model", "llama"), ("model", "x")])
    page = await admin.get(
        "/admin/v1/events", params=[("follow", "false"), ("limit", "1"), ("limit", "2")]
    )

    problem = problem_of(twice, 400)
    assert problem["detail"] == "model (2 times): a query parameter is given once"
    assert problem["errors"] == [
        {"key": "model", "message": "is given more than once", "source": "query"}
    ]
    assert problem_of(page, 400)["detail"] == "limit (2 times): a query parameter is given once"


async def test_a_query_parameter_sent_to_a_change_is_refused_before_anything_is_recorded(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await seeded(admin, pg_store)

    answer = await admin.post("/admin/v1/nodes/gpu-1/drain", params={"grace_s": "60"})

    problem = problem_of(answer, 400)
    assert problem["detail"] == (
        "grace_s: not a query parameter of /admin/v1/nodes/gpu-1/drain "
        "(it takes no query parameter)"
    )
    assert await last_position(pg_store) == before


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/admin/v1/keys?limit=0", "limit: Expected `int` >= 1"),
        ("/admin/v1/events?follow=maybe", "follow: Expected `bool`, got `str`"),
        ("/admin/v1/history/model/llama?before=abc", "before: Expected `int | null`, got `str`"),
    ],
    ids=["limit", "follow", "before"],
)
async def test_a_query_parameter_of_the_wrong_shape_is_named_in_the_detail(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, path: str, detail: str
) -> None:
    await seeded(admin, pg_store)

    answer = await admin.get(path)

    assert problem_of(answer, 400)["detail"] == detail


@pytest.mark.parametrize(("after", "before"), [(12, 12), (12, 5)], ids=["at", "past"])
async def test_history_after_at_or_past_before_is_a_400_naming_both(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, after: int, before: int
) -> None:
    # It was a 200 with no events: a history that looked empty, not a request that was wrong.
    await seeded(admin, pg_store)

    answer = await admin.get(
        "/admin/v1/history/model/llama", params={"after": after, "before": before}
    )
    just_before = await admin.get(
        "/admin/v1/history/model/llama", params={"after": before - 1, "before": before}
    )

    reason = f"must be less than before ({before}): no event is after {after} and before {before}"
    problem = problem_of(answer, 400)
    assert problem["detail"] == f"after ({after}) {reason}"
    assert problem["errors"] == [{"key": "after", "message": reason, "source": "query"}]
    assert just_before.status_code == 200, just_before.text
