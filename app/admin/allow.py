"""The ``Allow`` header of an ``OPTIONS`` answer: every method the path takes.

Litestar makes an ``OPTIONS`` handler for each route it builds, naming that route's
methods. Handlers of one path registered in turn (a model's ``GET`` and ``DELETE`` beside
its ``PUT``) are merged into a new route that keeps the first route's ``OPTIONS`` handler,
and with it the first route's list: ``OPTIONS /admin/v1/models/llama`` named
``OPTIONS, PUT`` while a 405 at the same path named ``GET`` and ``DELETE`` too. The
middleware here answers from the routes as the app serves them, as a 405 does.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.routes import HTTPRoute
from litestar.types import ASGIApp, Message, Receive, Scope, Send


def allow_value(app: Litestar, path_template: str) -> str | None:
    """The ``Allow`` value of the route at ``path_template`` (``/models/{name}``, as Litestar
    puts it in the scope): its methods, sorted."""
    for route in app.routes:
        if isinstance(route, HTTPRoute) and route.path_format == path_template:
            return ", ".join(sorted(route.methods))
    return None


def allow_every_method(app: ASGIApp) -> ASGIApp:
    """Middleware: an ``OPTIONS`` answer's ``Allow`` names every method of its route."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["method"] != "OPTIONS":
            await app(scope, receive, send)
            return
        allow = allow_value(scope["litestar_app"], scope.get("path_template", ""))

        async def send_with_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and allow is not None:
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() != b"allow"
                ]
                message["headers"] = [*headers, (b"allow", allow.encode("ascii"))]
            await send(message)

        await app(scope, receive, send_with_allow)

    return middleware
