"""What any request to the admin API may be answered, whatever its route, as the served
schema describes it: a 405 where a path parameter makes the path another route's, a 408, a
413 or a 431 from the listener before the app sees the request, a 500 for an error the
server did not expect. Each is sent for real, over a loopback socket to the app served as
``llmgw-server serve`` serves it, and its body is checked against the component the schema
names for it: a client generated from the schema reads it by that component.

No database is reached but for the 500, which a failing read stands for."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema_rs
import msgspec
import pytest
import pytest_asyncio
from litestar.routes import HTTPRoute
from sqlalchemy.ext.asyncio import create_async_engine

from app.admin.bodies import MAX_BODY_BYTES
from app.admin.other_paths import answered_405
from app.listeners.limits import DEFAULT_MAX_HEADER_BYTES, ListenerLimits
from app.services.operations import Operations
from app.store.postgres import PostgresEventStore
from tests.support.admin_routes import admin_app, operations
from tests.support.admin_server import LOOPBACK, serving_admin

pytestmark = pytest.mark.timeout(60)

TOKEN = secrets.token_hex(16)
PROBLEM = "application/problem+json"
SCHEMA_PATH = "/admin/v1/schema/openapi.json"
QUICK = ListenerLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=64)
ANY_ROUTE = ("408", "413", "431", "500")


@pytest_asyncio.fixture(loop_scope="session")
async def admin() -> AsyncIterator[httpx.AsyncClient]:
    """A client with a token; there is no database behind the app."""
    engine = create_async_engine(f"postgresql+asyncpg://nobody@{LOOPBACK}:9/none")
    try:
        async with (
            serving_admin(PostgresEventStore(engine), tokens={TOKEN: "alice"}, limits=QUICK) as url,
            httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}) as client,
        ):
            yield client
    finally:
        await engine.dispose()


async def served_schema(admin: httpx.AsyncClient) -> dict[str, Any]:
    answer = await admin.get(SCHEMA_PATH)
    assert answer.status_code == 200
    schema: dict[str, Any] = answer.json()
    return schema


def misfits(schema: dict[str, Any], response: dict[str, Any], document: object) -> list[str]:
    """Where ``document`` is not what the schema's ``response`` says its problem document
    is, besides any field the component does not describe."""
    shape = response["content"][PROBLEM]["schema"]
    validator = jsonschema_rs.validator_for(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            **shape,
            "components": schema["components"],
        }
    )
    found = [error.message for error in validator.iter_errors(document)]
    component = schema["components"]["schemas"][shape["$ref"].rsplit("/", 1)[1]]
    assert isinstance(document, dict)
    found += [
        f"{field} is not described" for field in document if field not in component["properties"]
    ]
    return found


async def raw_answer(port: int, sent: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``sent`` and nothing more; the answer the listener gives, once it closes."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        writer.write(sent)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split(" ")[1]), {k.lower(): v for k, v in fields.items()}, body


def port_of(admin: httpx.AsyncClient) -> int:
    port = admin.base_url.port
    assert port is not None
    return port


async def test_every_operation_describes_the_answers_any_request_may_get(
    admin: httpx.AsyncClient,
) -> None:
    schema = await served_schema(admin)

    lacking = [
        f"{method.upper()} {path} {status}"
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        for status in ANY_ROUTE
        if PROBLEM not in operation["responses"].get(status, {}).get("content", {})
    ]

    assert lacking == []


async def test_a_405_is_described_exactly_where_a_path_can_be_another_routes(
    admin: httpx.AsyncClient,
) -> None:
    schema = await served_schema(admin)
    app = admin_app()  # as serving_admin builds it: the same routes
    routes = [r for r in app.routes if isinstance(r, HTTPRoute)]

    checked = 0
    for operation in operations(app):
        described = schema["paths"][operation.path][operation.method.lower()]["responses"]
        route = next(r for r in routes if r.path_format == operation.path)
        found = answered_405(route, operation.method, routes)
        assert ("405" in described) == (found is not None), operation
        if found is None:
            continue
        witness, _ = found
        answer = await admin.request(operation.method, witness)

        assert answer.status_code == 405, (str(operation), witness, answer.text)
        assert answer.headers["content-type"] == PROBLEM
        assert described["405"]["headers"]["Allow"]["required"] is True
        allow = {m.strip() for m in answer.headers["allow"].split(",")}
        assert operation.method not in allow
        document = answer.json()
        assert document["title"] == "method-not-allowed"
        assert misfits(schema, described["405"], document) == [], witness
        checked += 1

    assert checked >= 10, "model, node, replica, drain and key paths each have one"


async def test_headers_that_do_not_arrive_in_time_get_the_408_the_schema_describes(
    admin: httpx.AsyncClient,
) -> None:
    schema = await served_schema(admin)

    status, fields, body = await raw_answer(
        port_of(admin), b"GET /admin/v1/models HTTP/1.1\r\nHost: llmgw\r\n"
    )

    assert status == 408
    assert fields["content-type"] == PROBLEM
    document = msgspec.json.decode(body)
    assert document["title"] == "request-timeout"
    described = schema["paths"]["/admin/v1/models"]["get"]["responses"]["408"]
    assert misfits(schema, described, document) == []


async def test_a_get_that_announces_a_body_over_the_limit_gets_the_413_the_schema_describes(
    admin: httpx.AsyncClient,
) -> None:
    schema = await served_schema(admin)

    status, fields, body = await raw_answer(
        port_of(admin),
        b"GET /admin/v1/models HTTP/1.1\r\nHost: llmgw\r\nContent-Length: %d\r\n\r\n"
        % (MAX_BODY_BYTES + 1),
    )

    assert status == 413
    assert fields["content-type"] == PROBLEM
    document = msgspec.json.decode(body)
    assert document["title"] == "request-entity-too-large"
    described = schema["paths"]["/admin/v1/models"]["get"]["responses"]["413"]
    assert misfits(schema, described, document) == []


async def test_headers_over_the_limit_get_the_431_the_schema_describes(
    admin: httpx.AsyncClient,
) -> None:
    schema = await served_schema(admin)
    filler = b"x" * (DEFAULT_MAX_HEADER_BYTES + 1024)

    status, fields, body = await raw_answer(
        port_of(admin),
        b"GET /admin/v1/models HTTP/1.1\r\nHost: llmgw\r\nX-Filler: %s\r\n\r\n" % filler,
    )

    assert status == 431
    assert fields["content-type"] == PROBLEM
    document = msgspec.json.decode(body)
    assert document["title"] == "request-header-fields-too-large"
    described = schema["paths"]["/admin/v1/models"]["get"]["responses"]["431"]
    assert misfits(schema, described, document) == []


async def test_an_error_the_server_did_not_expect_gets_the_500_the_schema_describes(
    admin: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = await served_schema(admin)

    async def broken(self: Operations) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Operations, "current", broken)
    answer = await admin.get("/admin/v1/replicas/llama-1")

    assert answer.status_code == 500
    assert answer.headers["content-type"] == PROBLEM
    document = answer.json()
    assert document["title"] == "internal-error"
    described = schema["paths"]["/admin/v1/replicas/{replica_id}"]["get"]["responses"]["500"]
    assert misfits(schema, described, document) == []
