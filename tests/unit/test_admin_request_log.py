"""The admin API's request line: one per request, at debug unless the answer was 5xx, with
the request id bound for every line logged while the request is handled."""

from __future__ import annotations

from typing import Any

import structlog
from litestar.types import Message, Receive, Scope, Send
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from app.admin.middleware import answer_head_as_get, log_requests

log = structlog.get_logger("tests.admin")


def answering(status: int) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        log.info("handler_ran")
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


async def request(status: int, path: str, request_id: str) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Any = {
        "type": "http",
        "method": "GET",
        "path": path,
        "headers": [(b"x-request-id", request_id.encode())],
    }
    await log_requests(answering(status))(scope, receive, send)
    return sent


async def test_an_answered_request_is_one_debug_line_and_its_handlers_lines_carry_its_id() -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        await request(200, "/admin/v1/nodes", "ticket-1")
        await request(404, "/admin/v1/models/none", "ticket-2")

    assert [(e["event"], e["log_level"], e["request_id"]) for e in logs] == [
        ("handler_ran", "info", "ticket-1"),
        ("admin_request", "debug", "ticket-1"),
        ("handler_ran", "info", "ticket-2"),
        ("admin_request", "debug", "ticket-2"),
    ]
    assert (logs[1]["path"], logs[1]["status"]) == ("/admin/v1/nodes", 200)
    assert "request_id" not in structlog.contextvars.get_contextvars()


async def test_a_failed_request_is_an_error_and_health_checks_log_nothing() -> None:
    with capture_logs() as logs:
        await request(503, "/admin/v1/replicas", "ticket-3")
        await request(200, "/healthz", "ticket-4")
        await request(200, "/metrics", "ticket-5")

    lines = [e for e in logs if e["event"] == "admin_request"]
    assert [(e["log_level"], e["status"], e["path"]) for e in lines] == [
        ("error", 503, "/admin/v1/replicas")
    ]


async def test_a_head_is_handled_as_its_get_logged_as_a_head_and_sent_no_body() -> None:
    sent: list[Message] = []
    seen: list[tuple[str, Message]] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def get_only(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": True})
        seen.append((scope["method"], await receive()))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    scope: Any = {"type": "http", "method": "HEAD", "path": "/admin/v1/nodes", "headers": []}
    with capture_logs() as logs:
        await answer_head_as_get(log_requests(get_only))(scope, receive, send)

    assert seen == [("GET", {"type": "http.disconnect"})]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert (sent[1]["body"], sent[1]["more_body"]) == (b"", False)
    assert [(e["method"], e["status"]) for e in logs if e["event"] == "admin_request"] == [
        ("HEAD", 200)
    ]
    assert scope["method"] == "HEAD"
