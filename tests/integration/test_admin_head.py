"""Load balancers and monitoring probes asking the admin API with ``HEAD``: every path that
serves ``GET`` answers it with the status and headers its ``GET`` gets and no body, guarded
as the ``GET`` is, recording nothing. The Litestar app served by uvicorn on a loopback
socket, over real HTTP, against a fresh PostgreSQL database per test.

Each ``HEAD`` was answered 405 (``HEAD is not a method of /healthz; it takes OPTIONS, GET``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from litestar.routes import HTTPRoute
from sqlalchemy.ext.asyncio import create_async_engine

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator
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
PATH_PARAMETER = re.compile(r"\{(?P<name>[^}:]+)(?::(?P<type>[^}]+))?\}")
SAME_HEADERS = ("content-type", "content-length", "allow", "retry-after")
"""What a HEAD answer says as its GET's does (its request id and date are its own)."""


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        await seed_node(pg_store, "gpu-1")
        declared = await client.put("/admin/v1/models/llama", json={"command": COMMAND})
        assert declared.status_code == 200, declared.text
        await seed_serving_replica(pg_store, "llama-1", "gpu-1")
        yield client


def every_get_path() -> list[str]:
    """Each path the app serves ``GET`` on, its parameters filled with names of nothing in
    particular (an unknown thing is answered 404 to both methods alike)."""
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:9/none")
    app = create_admin_app(PostgresEventStore(engine), TokenAuthenticator({}))

    def filled(match: re.Match[str]) -> str:
        return "0" if match["type"] == "int" else "llama"

    return sorted(
        PATH_PARAMETER.sub(filled, route.path)
        for route in app.routes
        if isinstance(route, HTTPRoute) and "GET" in route.methods
    )


def as_a_get_answers(answer: httpx.Response) -> tuple[int, dict[str, str]]:
    return answer.status_code, {
        name: answer.headers[name] for name in SAME_HEADERS if name in answer.headers
    }


@pytest.mark.parametrize(
    "path",
    [
        "/healthz",
        "/admin/v1/schema/openapi.json",
        "/admin/v1/models",
        "/admin/v1/models/llama",
        "/admin/v1/models/nobody",
        "/admin/v1/history/model/llama",
        "/admin/v1/events?follow=false",
    ],
)
async def test_a_head_is_answered_as_its_get_without_a_body(
    admin: httpx.AsyncClient, path: str
) -> None:
    got = await admin.get(path)

    head = await admin.head(path)

    assert head.content == b""
    assert as_a_get_answers(head) == as_a_get_answers(got)
    assert int(head.headers["content-length"]) == len(got.content)
    # The connection carried no stray body: the next request on it is answered as usual.
    assert (await admin.get("/healthz")).json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/readyz", "/metrics"])
async def test_a_probe_of_a_changing_page_gets_its_status_and_length_without_a_body(
    admin: httpx.AsyncClient, path: str
) -> None:
    head = await admin.head(path)

    assert head.status_code == 200
    assert head.content == b""
    assert int(head.headers["content-length"]) > 0


async def test_every_path_that_serves_get_serves_head_and_records_nothing(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await last_position(pg_store)

    answers = {
        path: (await admin.head(path, params={"follow": "false"} if "events" in path else None))
        for path in every_get_path()
    }

    assert {path: a.status_code for path, a in answers.items() if a.status_code == 405} == {}
    assert {path: a.content for path, a in answers.items() if a.content} == {}
    assert await last_position(pg_store) == before


async def test_a_head_is_refused_without_credentials_as_its_get_is(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await last_position(pg_store)
    async with httpx.AsyncClient(base_url=admin.base_url) as stranger:
        got = await stranger.get("/admin/v1/models")
        head = await stranger.head("/admin/v1/models")

    assert head.status_code == 401
    assert head.content == b""
    assert as_a_get_answers(head) == as_a_get_answers(got)
    assert await last_position(pg_store) == before


async def test_a_head_of_a_followed_event_stream_answers_its_start_and_ends(
    admin: httpx.AsyncClient,
) -> None:
    head = await admin.head("/admin/v1/events")

    assert head.status_code == 200
    assert head.headers["content-type"].startswith("text/event-stream")
    assert head.content == b""
    assert (await admin.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/admin/v1/models/llama", "DELETE, GET, HEAD, OPTIONS, PUT"),
        ("/healthz", "GET, HEAD, OPTIONS"),
        ("/admin/v1/models/llama/autoscale", "DELETE, OPTIONS, PATCH, PUT"),
    ],
)
async def test_options_names_head_wherever_it_names_get(
    admin: httpx.AsyncClient, path: str, methods: str
) -> None:
    options = await admin.options(path)

    assert options.headers["allow"] == methods


async def test_a_405_names_head_beside_get_and_a_head_where_no_get_is_is_a_405(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore
) -> None:
    before = await last_position(pg_store)

    posted = await admin.post("/admin/v1/nodes/gpu-1")
    head = await admin.head("/admin/v1/nodes/gpu-1/drain")
    got = await admin.get("/admin/v1/nodes/gpu-1/drain")

    assert set(posted.headers["allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    assert problem_of(posted, 405)["detail"] == (
        f"POST is not a method of /admin/v1/nodes/gpu-1; it takes {posted.headers['allow']}"
    )
    assert head.status_code == 405
    assert head.content == b""
    assert head.headers["allow"] == got.headers["allow"]
    assert "HEAD" not in head.headers["allow"]
    assert await last_position(pg_store) == before
