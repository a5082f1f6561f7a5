"""The request line of a refusal that a middleware raises before the request reaches its
route's handler: a path with an empty segment or an encoded ``/`` (``app.admin.middleware``).
Any client, without a token, can send one: its line says the 404 it was answered, at debug
as any other 404, not a 500 at error, which would page the operator at a stranger's will
and hide the errors that matter; and the answer carries the request id the line does.

Sent for real, over a loopback socket to the app served as ``llmgw-server serve`` serves it.
No database is reached: a refused path never gets that far."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import create_async_engine
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import LOOPBACK, problem_of, serving_admin

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture(loop_scope="session")
async def stranger() -> AsyncIterator[httpx.AsyncClient]:
    """A client without a token, of an app with no database behind it."""
    engine = create_async_engine(f"postgresql+asyncpg://nobody@{LOOPBACK}:9/none")
    try:
        async with (
            serving_admin(
                PostgresEventStore(engine), tokens={secrets.token_hex(16): "alice"}
            ) as url,
            httpx.AsyncClient(base_url=url) as client,
        ):
            yield client
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/v1/models//rollout"),
        ("DELETE", "/admin/v1/models/x%2Fautoscale"),
        ("OPTIONS", "/admin/v1/nodes//drain"),
        ("HEAD", "/admin/v1/models//rollout"),
    ],
)
async def test_a_split_path_is_logged_as_the_404_it_was_answered(
    stranger: httpx.AsyncClient, method: str, path: str
) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        answer = await stranger.request(method, path, headers={"x-request-id": "ticket-404"})

    assert answer.status_code == 404
    if method != "HEAD":
        assert problem_of(answer, 404)["title"] == "not-found"
    [line] = [entry for entry in logs if entry["event"] == "admin_request"]
    assert (line["method"], line["status"], line["log_level"]) == (method, 404, "debug")
    assert line["request_id"] == answer.headers["x-request-id"] == "ticket-404"
    assert [entry for entry in logs if entry["log_level"] == "error"] == []
