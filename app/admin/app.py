"""The admin REST API (Litestar), served on the admin listener only."""

from __future__ import annotations

from litestar import Litestar, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from app.admin.auth import TokenAuthenticator
from app.admin.errors import EXCEPTION_HANDLERS
from app.admin.history import HistoryController
from app.store.postgres import PostgresEventStore


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def create_admin_app(store: PostgresEventStore, authenticator: TokenAuthenticator) -> Litestar:
    async def provide_store() -> PostgresEventStore:
        return store

    return Litestar(
        route_handlers=[HistoryController, healthz],
        dependencies={"store": Provide(provide_store)},
        state=State({"authenticator": authenticator}),
        exception_handlers=EXCEPTION_HANDLERS,
        openapi_config=OpenAPIConfig(title="llmgw admin API", version="1", path="/admin/v1/schema"),
        debug=False,
    )
