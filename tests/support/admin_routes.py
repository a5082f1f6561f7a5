"""The admin app as ``create_admin_app`` builds it, with no database behind it (nothing is
served), and each operation its OpenAPI schema describes, paired with the handler that
serves it: for tests that hold the schema to what the handlers do."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from sqlalchemy.ext.asyncio import create_async_engine

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator
from app.store.postgres import PostgresEventStore

REFERENCE = "#/components/schemas/"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    handler: HTTPRouteHandler
    schema: dict[str, Any]
    """The operation as the schema describes it."""

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def admin_app() -> Litestar:
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:9/none")
    return create_admin_app(PostgresEventStore(engine), TokenAuthenticator({}))


def operations(app: Litestar) -> Iterator[Operation]:
    """Every operation the schema describes, with the handler that serves it."""
    paths = app.openapi_schema.to_schema()["paths"]
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            if not handler.resolve_include_in_schema():
                continue
            for method in sorted(handler.http_methods):
                described = paths[route.path_format][method.lower()]
                yield Operation(method, route.path_format, handler, described)


def component(schema: dict[str, Any], shape: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The component that ``shape`` names (``{"$ref": ...}``, or one of a ``oneOf`` with
    null), and its schema."""
    reference = shape.get("$ref") or next(s["$ref"] for s in shape["oneOf"] if "$ref" in s)
    name = reference.removeprefix(REFERENCE)
    return name, schema["components"]["schemas"][name]
