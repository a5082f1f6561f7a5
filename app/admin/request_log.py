"""One log line per admin API request, carrying its request id and actor: at debug, so
that polling and health checks write nothing at info, unless the answer was 5xx (error) or
the request slow (warning; an event stream is long by design, never slow), as
``app.logs.request_level`` says.

The request id is the client's ``X-Request-Id`` when it sent a usable one, else a new one;
it is bound to structlog's context for the request (so every line logged while handling it
carries it), echoed in the answer's ``x-request-id``, and recorded as the correlation id of
the events the request causes.
"""

from __future__ import annotations

import re
import time
from typing import Any

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.admin.auth import ACTOR_KEY
from app.logs import request_level
from app.services.operations import new_request_id

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID_KEY = "llmgw_request_id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

log = structlog.get_logger("llmgw.admin")


def request_id_of(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            sent = value.decode("latin-1")
            if _REQUEST_ID.match(sent):
                return sent
    return new_request_id()


def log_requests(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        request_id = request_id_of(scope)
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
                path = scope.get("path", "")
                if path not in _QUIET_PATHS or status >= 500:
                    duration_s = time.perf_counter() - started
                    log.log(
                        request_level(status, 0.0 if streaming else duration_s),
                        "admin_request",
                        method=scope.get("method"),
                        path=path,
                        status=status,
                        actor=state.get(ACTOR_KEY),
                        duration_ms=round(duration_s * 1000, 1),
                    )

    return middleware
