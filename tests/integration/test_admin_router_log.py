"""Every request to the admin API is one ``admin_request`` line, and its answer carries the
request id the line does: those the router refuses itself too, a path that names no route
(404) and a method the path does not take (405), which are answered before any of the
app's middleware runs. A scanner probing the API, or a script sending a wrong path, is in
the log, at debug as any other 404, not at error.

The Litestar app served by uvicorn on a loopback socket, over real HTTP, against a fresh
PostgreSQL database per test."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import bearer_client, serving_admin

pytestmark = pytest.mark.timeout(60)

OPERATOR = "alice"
TOKEN = secrets.token_hex(16)


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serving_admin(pg_store, tokens={TOKEN: OPERATOR}) as url,
        bearer_client(url, TOKEN) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("method", "path", "status", "actor"),
    [
        ("GET", "/admin/v1/nothing-here", 404, None),
        ("GET", "/wp-login.php", 404, None),
        ("HEAD", "/admin/v1/nothing-here", 404, None),
        ("PATCH", "/admin/v1/models", 405, None),
        ("HEAD", "/admin/v1/models/llama/scale", 405, None),
        ("GET", "/admin/v1/models", 200, OPERATOR),
        ("HEAD", "/admin/v1/models", 200, OPERATOR),
        # Logged as sent: the router's collapsed path would name a model "autoscale".
        ("DELETE", "/admin/v1/models//autoscale", 404, None),
        ("GET", "/admin/v1//models", 404, None),
    ],
)
async def test_every_request_is_one_line_carrying_the_id_of_its_answer(
    admin: httpx.AsyncClient, method: str, path: str, status: int, actor: str | None
) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        answer = await admin.request(method, path, headers={"x-request-id": "ticket-77"})

    assert answer.status_code == status
    [line] = [entry for entry in logs if entry["event"] == "admin_request"]
    assert (line["method"], line["path"], line["status"]) == (method, path, status)
    assert (line["log_level"], line["actor"]) == ("debug", actor)
    assert line["request_id"] == answer.headers["x-request-id"] == "ticket-77"
    assert [entry for entry in logs if entry["log_level"] == "error"] == []


async def test_a_refused_request_without_an_id_is_given_one(admin: httpx.AsyncClient) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        answer = await admin.get("/admin/v1/nothing-here")

    assert answer.status_code == 404
    [line] = [entry for entry in logs if entry["event"] == "admin_request"]
    assert line["request_id"] == answer.headers["x-request-id"]
    assert answer.headers["x-request-id"].startswith("req-")
