"""``HEAD`` on the admin listener: every path that serves ``GET`` serves ``HEAD`` too, as
HTTP asks (RFC 9110 9.3.2), with the status and headers its ``GET`` would answer
(``Content-Length`` included) and no body. Load balancers and monitoring probes ask
``HEAD /healthz``; Litestar routes a ``GET`` handler for ``GET`` alone, and answered them 405.

Litestar's app middleware runs once a request is routed, after the router has refused a
method the path does not take, so this sits in front of the router, around the app's whole
handler (``serve_head``): a ``HEAD`` is routed, guarded and handled as the ``GET`` of its
path, and its answer is sent without a body. It is a ``GET`` all the way: a guard refuses
it as it refuses the ``GET`` (401 without credentials), and a ``GET`` records nothing. A path
without a ``GET`` answers it 405 naming ``HEAD``, as it answers any method it does not take.

The answer ends with its start, before any of the body is sent: the ``GET``'s handler has
run by then, and a stream (``/admin/v1/events``) that would go on for ever is told, as ASGI
tells an app whose answer has been sent, that the client is gone, so it stops at once; what
it would have sent goes nowhere.

Wherever an ``Allow`` names ``GET`` (an ``OPTIONS`` answer, a 405) it names ``HEAD`` too
(``with_head``).
"""

from __future__ import annotations

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

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


def serve_head(app: Litestar) -> None:
    """Makes ``app`` answer ``HEAD`` on every path it serves ``GET`` on; once, when it is
    built."""
    app.asgi_handler = answer_head_as_get(app.asgi_handler)
