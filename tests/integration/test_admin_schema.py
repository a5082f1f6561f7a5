"""The admin API's schema as an operator on an air-gapped site reads it: over real HTTP to
the app served by uvicorn on a loopback socket, without a token. Every page under
``/admin/v1/schema`` works without the internet: none loads anything from another host."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
import yaml
from sqlalchemy.ext.asyncio import create_async_engine

from app.store.postgres import PostgresEventStore
from tests.support.admin_server import serving_admin

LOOPBACK = "127.0.0.1"
PREVIEWS = {("post", "/admin/v1/models/{name}/preview"), ("post", "/admin/v1/placement")}
"""The POSTs that record nothing, so read no Idempotency-Key."""
ABSOLUTE_URL = re.compile(r"(?:https?:)?//([^/\s\"'<>]+)")


@pytest_asyncio.fixture(loop_scope="session")
async def admin() -> AsyncIterator[httpx.AsyncClient]:
    """A client without a token; the schema reaches no database, so none is there."""
    engine = create_async_engine(f"postgresql+asyncpg://nobody@{LOOPBACK}:9/none")
    try:
        async with (
            serving_admin(PostgresEventStore(engine)) as url,
            httpx.AsyncClient(base_url=url) as client,
        ):
            yield client
    finally:
        await engine.dispose()


async def test_the_schema_root_is_a_page_that_loads_nothing_from_another_host(
    admin: httpx.AsyncClient,
) -> None:
    response = await admin.get("/admin/v1/schema")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(", page, re.IGNORECASE), page
    own = admin.base_url.netloc.decode()
    assert {host for host in ABSOLUTE_URL.findall(page)} <= {own}, page
    assert 'href="/admin/v1/schema/openapi.json"' in page
    assert f"curl -s http://{own}/admin/v1/schema/openapi.json" in page


async def test_the_schema_is_served_as_json(admin: httpx.AsyncClient) -> None:
    response = await admin.get("/admin/v1/schema/openapi.json")

    assert response.status_code == 200
    schema = response.json()
    assert schema["info"]["title"] == "llmgw admin API"
    assert "/admin/v1/models" in schema["paths"]


async def test_the_yaml_schema_is_the_json_one_and_loads_without_python_tags(
    admin: httpx.AsyncClient,
) -> None:
    as_json = await admin.get("/admin/v1/schema/openapi.json")
    as_yaml = await admin.get("/admin/v1/schema/openapi.yaml")

    assert as_yaml.status_code == 200
    assert "!!python" not in as_yaml.text
    assert yaml.safe_load(as_yaml.text) == as_json.json()


async def test_no_viewer_that_needs_a_cdn_is_served(admin: httpx.AsyncClient) -> None:
    for viewer in ("swagger", "redoc", "rapidoc", "elements"):
        response = await admin.get(f"/admin/v1/schema/{viewer}")

        assert response.status_code == 404, viewer
        assert "cdn" not in response.text.lower(), viewer


async def test_every_change_that_reads_an_idempotency_key_declares_it(
    admin: httpx.AsyncClient,
) -> None:
    schema = (await admin.get("/admin/v1/schema/openapi.json")).json()

    declaring: dict[tuple[str, str], list[dict[str, object]]] = {}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            declared = operation.get("parameters", [])
            declaring[method, path] = [
                p for p in declared if str(p["name"]).lower() == "idempotency-key"
            ]
    changes = {op for op in declaring if op[0] in {"post", "put", "patch", "delete"}}
    assert ("post", "/admin/v1/models/{name}/scale") in changes
    assert {op for op, found in declaring.items() if found} == changes - PREVIEWS
    [header] = declaring["post", "/admin/v1/keys"]
    assert header["in"] == "header"
    assert header["required"] is False
    assert "Sending a change again" in str(header["description"])
    shape = header["schema"]
    assert isinstance(shape, dict)
    assert shape["type"] == "string"
    assert shape["maxLength"] == 130
    key = str(uuid.uuid4())
    pattern = re.compile(shape["pattern"])
    assert pattern.search(key)
    assert pattern.search(f'"{key}"')
    assert pattern.search("k" * 128)
    assert not pattern.search("k" * 129)
    assert not pattern.search("a key")
    assert not pattern.search(f'"{key}')


async def test_a_body_is_required_only_of_the_requests_that_cannot_do_without_one(
    admin: httpx.AsyncClient,
) -> None:
    # Litestar marked every body required: a client made from the schema would not send a
    # drain, an uncordon or a removal without one, though none needs it.
    schema = (await admin.get("/admin/v1/schema/openapi.json")).json()

    required = {
        (method, path): operation["requestBody"]["required"]
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if "requestBody" in operation
    }

    without_one = {
        ("delete", "/admin/v1/models/{name}"),
        ("delete", "/admin/v1/keys/{prefix_or_name}"),
        ("post", "/admin/v1/nodes/{node_id}/uncordon"),
        ("post", "/admin/v1/replicas/{replica_id}/drain"),
        ("post", "/admin/v1/nodes/{node_id}/drain"),
        ("post", "/admin/v1/nodes/{node_id}/cordon"),
        ("post", "/admin/v1/models/{name}/rollout/resume"),
    }
    with_one = {
        ("post", "/admin/v1/keys"),
        ("post", "/admin/v1/models/{name}/scale"),
        ("put", "/admin/v1/models/{name}/autoscale"),
        ("post", "/admin/v1/certificates/revocations"),
    }
    assert {op: required[op] for op in without_one} == dict.fromkeys(without_one, False)
    assert {op: required[op] for op in with_one} == dict.fromkeys(with_one, True)
