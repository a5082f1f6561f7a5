"""What every admin API request passes on its way to its handler, in the order it passes it.

The first two wrap the whole app, in front of its router (``put_in_front_of_router``), so
that every request passes them, those the router refuses itself included; the others are
the app's middleware (``MIDDLEWARE``), which Litestar runs once a request is routed.

1. **A ``HEAD`` is handled as the ``GET`` of its path** (``answer_head_as_get``). Every
   path that serves ``GET`` serves ``HEAD`` too, as HTTP asks (RFC 9110 9.3.2), with the
   status and headers its ``GET`` would answer (``Content-Length`` included) and no body.
   Load balancers and monitoring probes ask ``HEAD /healthz``; Litestar routes a ``GET``
   handler for ``GET`` alone, and answered them 405. Litestar's app middleware runs once a
   request is routed, after the router has refused a method the path does not take, so
   this sits in front of the router: a ``HEAD`` is routed, guarded and handled as the
   ``GET`` of its path, and its answer is sent without a body. It is a ``GET`` all the way:
   it passes everything below as that ``GET`` (a guard refuses it as it refuses the
   ``GET``, 401 without credentials, and a ``GET`` records nothing), and is logged as a
   ``HEAD``. A path without a ``GET`` answers it 405 naming ``HEAD``, as it answers any
   method it does not take. The answer ends with its start, before any of the body is
   sent: the ``GET``'s handler has run by then, and a stream (``/admin/v1/events``) that
   would go on for ever is told, as ASGI tells an app whose answer has been sent, that the
   client is gone, so it stops at once; what it would have sent goes nowhere. Wherever an
   ``Allow`` names ``GET`` (an ``OPTIONS`` answer, a 405) it names ``HEAD`` too
   (``with_head``).
2. **Its log line and request id** (``log_requests``). One log line per request, carrying
   its request id and actor: at debug, so that polling and health checks write nothing at
   info, unless the answer was 5xx (error) or the request slow (warning; an event stream is
   long by design, never slow), as ``app.logs.request_level`` says. The request id is the
   client's ``X-Request-Id`` when it sent a usable one, else a new one; it is bound to
   structlog's context for the request (so every line logged while handling it carries it),
   echoed in the answer's ``x-request-id``, and recorded as the correlation id of the events
   the request causes. Litestar answers a path that names no route (404) and a method the
   path does not take (405) in its router, before any of the app's middleware runs: in front
   of it, those are logged, and carry their id, as any other request is, a scanner's probes
   and a script's wrong paths included. The actor is the one the guard found
   (``app.admin.auth``), in the request's state, which the router and all below it share;
   none where it found none (a refusal, a health check).
3. **Paths whose segments are not the ones the client wrote are refused (404)**
   (``refuse_split_paths``). Litestar routes on the decoded path with its empty segments
   dropped, so ``DELETE /admin/v1/models//autoscale`` (a client that put an empty name in
   the path) would remove the model named ``autoscale``, and
   ``DELETE /admin/v1/models/x%2Fautoscale`` (a name holding a ``/``) would turn off the
   autoscaling of model ``x``. No name or id of llmgw is empty or holds a ``/``, so such a
   path names nothing: it is answered 404, as any path that names nothing is, before a
   guard or handler runs. The check reads the raw path, as the client sent it: Litestar has
   already rewritten ``path`` by the time an app's middleware runs. (Where the collapsed
   path names a route that does not take the method, Litestar answers 405 before this
   runs: nothing is done either way.)
4. **A body's leading UTF-8 byte order mark is dropped** (``skip_byte_order_mark``,
   ``app.listeners.bom``), so that every reader of it, ``app.admin.bodies`` first, sees
   the JSON alone.
5. **An ``OPTIONS`` answer's ``Allow`` names every method of the path**
   (``allow_every_method``). Litestar makes an ``OPTIONS`` handler for each route it
   builds, naming that route's methods; handlers of one path registered in turn (a
   model's ``GET`` and ``DELETE`` beside its ``PUT``) are merged into a route that keeps the
   first one's ``OPTIONS`` handler and its list: ``OPTIONS /admin/v1/models/llama`` named
   ``OPTIONS, PUT`` while a 405 at the same path named ``GET`` and ``DELETE`` too. The
   answer is taken from the routes as the app serves them, as a 405's is, and names
   ``HEAD`` wherever it names ``GET``.
"""

from __future__ import annotations

import re
import time
from typing import Any

import structlog
from litestar import Litestar
from litestar.enums import ScopeType
from litestar.exceptions import NotFoundException
from litestar.routes import HTTPRoute
from litestar.types import (
    ASGIApp,
    HTTPRequestEvent,
    Message,
    Receive,
    ReceiveMessage,
    Scope,
    Send,
)

from app.listeners.bom import LeadingMark
from app.logs import request_level
from app.services.operations import new_request_id

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID_KEY = "llmgw_request_id"
ACTOR_KEY = "llmgw_actor"
"""The key, in a request's state, of the actor the guard (``app.admin.auth``) found: set
there, read by the request's log line here and by the handlers."""
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

_ENCODED_SLASH = b"%2f"

log = structlog.get_logger("llmgw.admin")

HEAD = "HEAD"
ANSWERED_AS_GET = "llmgw_head"
"""The key, in a request's state, of a ``HEAD`` handled as a ``GET``."""

_END_OF_BODY: Message = {"type": "http.response.body", "body": b"", "more_body": False}
_GONE: ReceiveMessage = {"type": "http.disconnect"}


def requested_method(scope: Scope) -> str:
    """The method the client sent: ``HEAD`` for one handled as a ``GET``."""
    if scope.get("state", {}).get(ANSWERED_AS_GET):
        return HEAD
    return str(scope.get("method", ""))


def with_head(allow: str) -> str:
    """An ``Allow`` value (``OPTIONS, GET``) naming ``HEAD`` after ``GET`` where it names it."""
    methods = [method.strip() for method in allow.split(",") if method.strip()]
    if "GET" not in methods or HEAD in methods:
        return allow
    at = methods.index("GET") + 1
    return ", ".join([*methods[:at], HEAD, *methods[at:]])


def answer_head_as_get(app: ASGIApp) -> ASGIApp:
    """ASGI app: ``app``, with a ``HEAD`` handled as the ``GET`` of its path and answered
    without a body."""

    async def answering(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["method"] != HEAD:
            await app(scope, receive, send)
            return
        # A copy: the server reads the method of its own scope to send no body to a HEAD.
        as_get: Scope = {**scope, "method": "GET"}
        as_get.setdefault("state", {})[ANSWERED_AS_GET] = True
        answered = False

        async def receive_until_answered() -> ReceiveMessage:
            return _GONE if answered else await receive()

        async def send_start_only(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                await send(message)
                await send(_END_OF_BODY)
                answered = True

        await app(as_get, receive_until_answered, send_start_only)

    return answering


def request_id_of(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            sent = value.decode("latin-1")
            if _REQUEST_ID.match(sent):
                return sent
    return new_request_id()


def log_requests(app: ASGIApp) -> ASGIApp:
    """ASGI app: ``app``, with each HTTP request given its id and logged in one line."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        # As the client sent it: the router rewrites the scope's path (``//`` collapsed).
        path = scope.get("path", "")
        state: dict[str, Any] = scope.setdefault("state", {})
        state[REQUEST_ID_KEY] = request_id
        started = time.perf_counter()
        status = 500
        streaming = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                streaming = any(
                    name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                    for name, value in headers
                )
                headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await app(scope, receive, send_with_id)
            finally:
                if path not in _QUIET_PATHS or status >= 500:
                    duration_s = time.perf_counter() - started
                    log.log(
                        request_level(status, 0.0 if streaming else duration_s),
                        "admin_request",
                        method=requested_method(scope),
                        path=path,
                        status=status,
                        actor=state.get(ACTOR_KEY),
                        duration_ms=round(duration_s * 1000, 1),
                    )

    return middleware


def split_segment(raw_path: bytes) -> str | None:
    """Why ``raw_path`` cannot be routed as written, or None when it can."""
    if b"//" in raw_path:
        return "the path has an empty segment (//): no resource is named by nothing"
    if _ENCODED_SLASH in raw_path.lower():
        return "a path segment holds an encoded '/' (%2F): no name or id holds one"
    return None


def refuse_split_paths(app: ASGIApp) -> ASGIApp:
    """Middleware: 404 for a path that ``split_segment`` refuses."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            reason = split_segment(scope.get("raw_path") or b"")
            if reason is not None:
                raise NotFoundException(reason)
        await app(scope, receive, send)

    return middleware


def skip_byte_order_mark(app: ASGIApp) -> ASGIApp:
    """Middleware: a request's body reaches the app without a leading byte order mark."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        mark = LeadingMark()

        async def receive_without_mark() -> ReceiveMessage:
            message = await receive()
            if message["type"] != "http.request":
                return message
            more = message.get("more_body", False)
            body = mark.feed(message.get("body", b""), more=more)
            request: HTTPRequestEvent = {"type": "http.request", "body": body, "more_body": more}
            return request

        await app(scope, receive_without_mark, send)

    return middleware


def allow_value(app: Litestar, path_template: str) -> str | None:
    """The ``Allow`` value of the route at ``path_template`` (``/models/{name}``, as Litestar
    puts it in the scope): its methods, sorted, with ``HEAD`` after ``GET``."""
    for route in app.routes:
        if isinstance(route, HTTPRoute) and route.path_format == path_template:
            return with_head(", ".join(sorted(route.methods)))
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


def put_in_front_of_router(app: Litestar) -> None:
    """Makes every request ``app`` is sent pass ``answer_head_as_get``, then
    ``log_requests``, in front of its router; once, when it is built. In this order a
    ``HEAD`` is logged once, as the ``HEAD`` it is, and a 404 or 405 of the router is
    logged too."""
    app.asgi_handler = answer_head_as_get(log_requests(app.asgi_handler))


MIDDLEWARE = (refuse_split_paths, skip_byte_order_mark, allow_every_method)
"""In the order a request passes them, once it is routed."""
