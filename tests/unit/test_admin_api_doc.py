"""docs/admin-api.md names every endpoint the admin API serves, and only those: an operator
who reads the page finds every request a script could send, and sends none that is not
there. The routes are the app's own, as ``create_admin_app`` builds it (no database is
reached: nothing is served)."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator
from app.store.postgres import PostgresEventStore

PAGE = Path(__file__).resolve().parents[2] / "docs" / "admin-api.md"
SCHEMA = "/admin/v1/schema"
"""Litestar's OpenAPI pages, which the page names as a whole."""
NAMED = re.compile(
    r"`(?P<method>GET|POST|PUT|PATCH|DELETE) (?P<path>/(?:\{[^}]*\}|[^`?\s{])*)[^`]*`"
)
PARAMETER = re.compile(r"\{[^}]*\}")


def endpoint(method: str, path: str) -> str:
    """``GET /admin/v1/models/{}``: a path parameter named as a placeholder, whatever its
    name or type."""
    return f"{method} {PARAMETER.sub('{}', path)}"


def served() -> set[str]:
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:9/none")
    app = create_admin_app(PostgresEventStore(engine), TokenAuthenticator({}))
    return {
        endpoint(method, route.path)
        for route in app.routes
        if not route.path.startswith(SCHEMA)
        for method in getattr(route, "methods", ())
        if method != "OPTIONS"
    }


def on_the_page() -> set[str]:
    return {endpoint(m["method"], m["path"]) for m in NAMED.finditer(PAGE.read_text())}


def test_every_endpoint_the_api_serves_is_on_the_page() -> None:
    assert served() - on_the_page() == set()


def test_every_endpoint_the_page_names_is_served() -> None:
    assert on_the_page() - served() == set()
