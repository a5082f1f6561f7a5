"""One request and its answer between a connection and an ASGI app: the app's ``receive``
and ``send``, and running the app.

The connection (``httpserver``) feeds the request's body in (``feed``, ``end``) and says
when the client is gone (``disconnect``); the app reads it with ``receive`` and answers
with ``send``. What the app sends is written as it comes, but for one thing: the answer's
head waits for the first piece of body, so that a whole answer (head and body sent one
after the other) leaves in one ``write``, one system call. An answer without a length
(a stream) does not wait past the current turn of the loop for its first piece: its head
goes out as soon as the app waits for anything else.

``receive`` says ``http.disconnect`` once the client is gone, and, as uvicorn's does,
once the answer is complete: an app that watches for the client leaving wakes up and stops
watching either way.

A request sent with ``Expect: 100-continue`` is sent ``100 Continue`` when the app first
calls ``receive``. An app that answers without calling it (a refusal: 401, 413) leaves the
client holding its body back for good, so the connection closes after that answer.

An app that only needs to know when the client leaves (the gateway does, to cancel its
engine request) need not keep a task waiting on ``receive`` for it: the scope's extension
``ON_DISCONNECT`` (``scope["extensions"][ON_DISCONNECT](callback)``) has the connection
call ``callback`` once, if the client goes before the answer is complete; at once if it
already has. The connection knows when it is lost, so the signal costs no task, no
future and no wake-up per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import structlog

from app.listeners.http11 import (
    CONTINUE,
    AnswerHead,
    InvalidAnswer,
    answer_head,
    chunk,
    closing_answer,
)
from wire.asgi import App as App
from wire.asgi import Message as Message
from wire.asgi import Receive as Receive
from wire.asgi import Scope as Scope
from wire.asgi import Send as Send

HIGH_WATER_BYTES = 64 * 1024
"""A request body buffered beyond this, unread by the app, stops reading the socket."""
_SERVER_ERROR = b"Internal Server Error"
_DISCONNECT: Message = {"type": "http.disconnect"}
ON_DISCONNECT = "llmgw.on_disconnect"
"""The scope's extension (``scope["extensions"]``) that calls back when the client leaves
mid-request: ``ClientGone.on_disconnect``."""

log = structlog.get_logger(__name__)


class Wire(Protocol):
    """What an exchange needs of its connection."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    write_paused: bool

    def resume_reading(self) -> None:
        """Read the socket again (the app reads the body)."""
        ...

    def pause_reading(self) -> None:
        """Stop reading the socket (the app does not read the body)."""
        ...

    async def drain(self) -> None:
        """Until the transport takes writes again."""
        ...

    def answered(self, exchange: Exchange) -> None:
        """``exchange``'s answer is complete."""
        ...


class ClientGone:
    """One request's ``ON_DISCONNECT`` extension: the callback the app left, called if the
    client leaves before the answer is complete.

    Its own object, not a method of the ``Exchange``: the scope holds it, and a scope that
    held the exchange, which holds the scope, would be a reference cycle per request, left
    for the garbage collector to find (its pauses showed in the tail latency)."""

    __slots__ = ("_callback", "_over", "gone")

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None
        self._over = False
        self.gone = False

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once if the client leaves before the answer is complete; now,
        if it has left already. One callback per request: a second replaces the first."""
        if self.gone:
            callback()
        elif not self._over:
            self._callback = callback

    def left(self) -> None:
        """The client is gone, its answer unfinished."""
        self.gone = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()

    def over(self) -> None:
        """The answer is complete, or the app is done: the callback is dropped, unused."""
        self._over = True
        self._callback = None


class Exchange:
    """A request's ASGI cycle. ``keep_alive`` starts as the request's own wish."""

    __slots__ = (
        "_chunked",
        "_content_left",
        "_delivered_end",
        "_gone",
        "_head",
        "_waiter",
        "bodiless",
        "body",
        "complete",
        "disconnected",
        "keep_alive",
        "more_body",
        "scope",
        "started",
        "waiting_for_continue",
        "wire",
    )

    def __init__(
        self, wire: Wire, scope: Scope, *, keep_alive: bool, expect_continue: bool
    ) -> None:
        self.wire = wire
        self.scope = scope
        self.keep_alive = keep_alive
        self.waiting_for_continue = expect_continue
        self.bodiless = scope["method"] == "HEAD"
        self.body = b""
        self.more_body = True
        self.disconnected = False
        self.started = False
        self.complete = False
        self._delivered_end = False
        self._waiter: asyncio.Future[None] | None = None
        self._gone = ClientGone()
        scope["extensions"] = {ON_DISCONNECT: self._gone.on_disconnect}
        self._head: bytes | None = None
        self._chunked = False
        self._content_left = 0

    # -- the connection's side ------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """A piece of the request's body arrived."""
        if self.complete or self.disconnected:
            return  # answered without reading it all: the rest is dropped as it comes
        self.body += data
        if len(self.body) > HIGH_WATER_BYTES:
            self.wire.pause_reading()
        self._wake()

    def end(self) -> None:
        """The request's body is all here."""
        self.more_body = False
        self._wake()

    def disconnect(self) -> None:
        """The client is gone: what the app still sends is dropped."""
        if not self.complete:
            self.disconnected = True
            self._gone.left()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def run(self, app: App) -> None:
        """Run ``app`` on this request; a failure before the answer started is a 500, a
        cancel (the server stopping) no answer."""
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            self._gone.over()
            if not isinstance(exc, asyncio.CancelledError):
                log.error("asgi_app_failed", exc_info=exc)
            if self.disconnected or self.complete:
                pass
            elif isinstance(exc, asyncio.CancelledError):
                # The server stops (past its grace): the request ends unanswered, as when
                # its connection closes, not with a 500 for a fault of the app's.
                self.wire.transport.close()
            elif not self.started or self._head is not None:  # nothing of it written yet
                self._server_error()
            else:
                self.wire.transport.close()
            if not isinstance(exc, Exception):
                raise
        else:
            self._gone.over()
            if not self.started and not self.disconnected:
                log.error("asgi_app_answered_nothing")
                self._server_error()
            elif not self.complete and not self.disconnected:
                log.error("asgi_app_answer_unfinished")
                self.wire.transport.close()

    def _server_error(self) -> None:
        self.keep_alive = False
        self._head = None
        self.started = self.complete = True
        self.wire.transport.write(closing_answer(500, b"text/plain; charset=utf-8", _SERVER_ERROR))
        self._wake()
        self.wire.answered(self)

    # -- the app's side -------------------------------------------------------------------

    async def receive(self) -> Message:
        if self.waiting_for_continue:
            self.waiting_for_continue = False
            if not self.wire.transport.is_closing():
                self.wire.transport.write(CONTINUE)
        while not self.disconnected and not self.complete:
            if self.body or (not self.more_body and not self._delivered_end):
                body, self.body = self.body, b""
                self._delivered_end = not self.more_body
                self.wire.resume_reading()
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            self.wire.resume_reading()
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = self.wire.loop.create_future()
            await waiter
        return _DISCONNECT

    async def send(self, message: Message) -> None:
        wire = self.wire
        if wire.write_paused and not self.disconnected:
            await wire.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise InvalidAnswer(f"expected 'http.response.start', not {kind!r}")
            self._start(message)
        elif not self.complete:
            if kind != "http.response.body":
                raise InvalidAnswer(f"expected 'http.response.body', not {kind!r}")
            self._write_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise InvalidAnswer(f"{kind!r} sent after the answer was complete")

    def _start(self, message: Message) -> None:
        if self.waiting_for_continue and self.more_body:
            # Answered without asking for the body, which the client holds back until it
            # hears 100 Continue: that will not come now, and whether the body still will
            # cannot be known, so nothing more can be read on this connection.
            self.keep_alive = False
        head: AnswerHead = answer_head(
            message["status"],
            message.get("headers", ()),
            keep_alive=self.keep_alive,
            bodiless=self.bodiless,
            chunkable=self.scope["http_version"] == "1.1",
        )
        self.started = True
        self.waiting_for_continue = False
        self.keep_alive = head.keep_alive
        self._chunked = head.chunked
        self._content_left = head.content_length
        self._head = head.data
        if self._chunked:
            # A stream's head must not wait for an engine's first token.
            self.wire.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self.disconnected:
            self.wire.transport.write(head)

    def _write_body(self, body: bytes, more_body: bool) -> None:
        if self.bodiless:
            data = b""
        elif self._chunked:
            data = chunk(body, last=not more_body)
        elif self._content_left < 0:  # HTTP/1.0 without a length: ends with the connection
            data = body
        else:
            self._content_left -= len(body)
            if self._content_left < 0:
                raise InvalidAnswer("the answer's body is longer than its content-length")
            data = body
        if not more_body and self._content_left > 0:
            raise InvalidAnswer("the answer's body is shorter than its content-length")
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
        if data:
            self.wire.transport.write(data)
        if not more_body:
            self.complete = True
            self._gone.over()
            self._wake()
            self.wire.answered(self)
