"""The listeners' own HTTP/1.1 server: an asyncio protocol over httptools' parser that
serves an ASGI app, with the listener limits built in.

    server = HttpServer(app, limits=ListenerLimits(), idle_s=75, graceful_shutdown_s=30)
    await server.start(sock)     # the app's lifespan started, listening once this returns
    await server.serve()         # until stop(): in-flight requests finish, idle ones close
    server.stop()

Why not uvicorn: the gateway is a proxy whose every request passes here, and uvicorn's
protocol was the largest cost of the gateway's CPU (docs/performance.md, "Where llmgw's
CPU goes"): two writes per answer, a timer armed and cancelled per request, a check of
every header against two regular expressions. This server writes a whole answer in one
``write``, times every connection by one sweep per listener and checks a head in two
counts; what it serves is the same ASGI app.

Each connection reads requests one after another, in order: a request that arrives while
the one before is still being answered (pipelining) waits, its body buffered, and the
socket is not read meanwhile. A body the app does not read is buffered up to
``exchange.HIGH_WATER_BYTES`` before the socket stops being read (flow control). While a
socket is not read, the sweep asks it whether the client closed its side, which no read
would find: a client that leaves is seen to, unless the end of its stream waits behind
more than the sockets' buffers hold.

The limits (``ListenerLimits``), as ``app.listeners.limits`` puts them on uvicorn:

- the head within ``header_timeout_s`` of the connection opening, or of the first byte
  of the next request on a kept-alive one; the body within ``body_timeout_s`` of the
  head, not counting the time the socket is not read (flow control, a pipelined request
  waiting); otherwise 408, but for a connection that began no request in that time (it
  sent no byte, or empty lines only, which RFC 9112 (2.2) has a server ignore before a
  request), which is closed without an answer and counted apart
  (``ListenerRefusals.closed_silent``); empty lines do not restart the header timeout;
- a client that takes in nothing of its answer for ``send_timeout_s`` (the transport's
  buffer stays full) is disconnected, unsent bytes dropped: the app sees it gone, so its
  request ends and frees what it holds (a replica's slot at the gateway);
- a head of at most ``max_header_bytes``, otherwise 431; empty lines before a request are
  dropped as they come, so they count towards no head and are not kept, however many;
- a body its head announces (``Content-Length``) of at most ``max_body_bytes``, otherwise
  413 as soon as the head is read: the app never sees the request, and a client waiting
  for ``100 Continue`` is not sent one;
- at most ``max_connections`` connections: one more is answered 503 at once;
- a kept-alive connection idle for ``idle_s`` is closed, without an answer, and counted
  (``ListenerRefusals.closed_keepalive``); empty lines between requests begin no request,
  so they do not restart the idle time;
- a request HTTP cannot parse is answered 400, and so is one whose head a proxy in front
  could frame otherwise (``http11.framing_refusal``: no ``Host`` or two, a
  ``Transfer-Encoding`` but ``chunked``; 505 for a version but 1.0 and 1.1), before the
  app sees it.

What comes after a request that ends the connection (``Connection: close``, HTTP/1.0) is
dropped unread, and a chunked body's trailer is not added to the request's headers.

Each of those answers is counted and logged by reason (``app.listeners.refusals``; the 503
also says ``Retry-After``), is the listener's ``refusal`` and closes the connection, after
reading (and dropping) what the client still sends for ``LINGER_S``: a socket closed with
unread bytes resets the connection, and the client may lose the answer. An app's answer
that closes the connection (``connection: close``) while its request's body still comes
in (the gateway's 413 for a chunked body past its limit) ends it the same way: the rest of
the body is never parsed or fed to the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import socket
from collections import deque
from typing import Any, cast

import httptools

from app.listeners.exchange import App, Exchange
from app.listeners.http11 import closing_answer, framing_refusal, skip_empty_lines, split_target
from app.listeners.lifespan import Lifespan
from app.listeners.limits import (
    LINGER_S,
    ListenerLimits,
    Refusal,
    SendWatch,
    announces_more_than,
    body_over,
    head_over,
    plain_text,
)
from app.listeners.refusals import RETRY_AFTER_S, ListenerRefusals, RefusalReason

_ASGI = {"version": "3.0", "spec_version": "2.3"}
CANCELLED_ANSWERS_S = 1.0
"""How long requests cancelled at the end of a graceful shutdown have to end their answers
(a stream its last event) before every connection is closed: one turn of the loop is
enough for each, unless its client has stopped reading."""
_Stage = tuple[float, str]
_IDLE = "idle"


class _Listener:
    """What the connections of one listening socket share."""

    def __init__(
        self,
        app: App,
        limits: ListenerLimits,
        refusal: Refusal,
        refusals: ListenerRefusals,
        idle_s: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.app = app
        self.limits = limits
        self.refusal = refusal
        self.refusals = refusals
        self.loop = loop
        self.head: _Stage = (limits.header_timeout_s, "the request's headers")
        self.body: _Stage = (limits.body_timeout_s, "the request's body")
        self.idle: _Stage = (idle_s, _IDLE)
        self.sweep_every_s = min(
            1.0, limits.header_timeout_s / 4, limits.body_timeout_s / 4, limits.send_timeout_s / 4
        )
        self.connections: set[HttpConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.sweeping = False
        self.draining = False
        self.drained = asyncio.Event()
        """Set once draining, when no connection is open and no request runs."""

    def start(self, exchange: Exchange) -> None:
        task = self.loop.create_task(exchange.run(self.app))
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.check_drained()

    def check_drained(self) -> None:
        if self.draining and not self.connections and not self.tasks:
            self.drained.set()

    def watch(self) -> None:
        if not self.sweeping:
            self.sweeping = True
            self.loop.call_later(self.sweep_every_s, self._sweep)

    def _sweep(self) -> None:
        # One sweep per listener instead of a timer per request and stage: a timer would
        # cost every request four calls into the loop (arm and cancel, twice).
        now = self.loop.time()
        for connection in [c for c in self.connections if c.due <= now]:
            connection.overdue()
        for connection in [c for c in self.connections if c.reading_paused]:
            connection.check_peer()
        timeout_s = self.limits.send_timeout_s
        for connection in [c for c in self.connections if c.write_paused]:
            if connection.send_watch.stalled(connection.transport, now, timeout_s):
                connection.stalled()
        self.sweeping = bool(self.connections)
        if self.sweeping:
            self.loop.call_later(self.sweep_every_s, self._sweep)


_PEER_CLOSED = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR
"""What ``poll`` reports of a socket whose peer closed (its side, or all of it: a reset)."""


class HttpConnection(asyncio.Protocol):
    """One client connection: parses its requests and runs an ``Exchange`` for each."""

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.loop = listener.loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.write_paused = False
        self.send_watch = SendWatch()
        self.due = math.inf
        self._stage = listener.head
        self._reading_head = True
        self._head_bytes = 0
        self._requested = False
        """Whether a request has begun on this connection: until one has, what came
        (nothing, or empty lines, which begin none) asked nothing to answer."""
        self._between_requests = True
        """No request is begun (none yet, or the last one read whole): empty lines that
        come now are dropped before the parser (``http11.skip_empty_lines``)."""
        self._lingering = False
        self._read_paused = False
        self._body_left_s: float | None = None
        """The body's time left, kept while reading is paused: the server is not reading
        then (the app has not taken what came, or answers the request before), so that time
        is not the client's."""
        self._drained: asyncio.Future[None] | None = None
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_continue = False
        self._content_length: bytes | None = None
        self._hosts = 0
        self._transfer_encoding: bytes | None = None
        self._read_last = False
        """The request read last ends the connection (``Connection: close``, HTTP/1.0, an
        upgrade, a shutdown): whatever the client sends after it is dropped unread."""
        self._current: Exchange | None = None
        """The request whose answer the app is writing."""
        self._reading: Exchange | None = None
        """The request whose body is arriving."""
        self._waiting: deque[Exchange] = deque()
        """Requests read (pipelined) while the one before is answered."""

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport's subclasses, only its likeness.
        self.transport = transport = cast(asyncio.Transport, transport)
        self._client = _address(transport.get_extra_info("peername"))
        self._server = _address(transport.get_extra_info("sockname"))
        listener = self.listener
        listener.connections.add(self)
        if len(listener.connections) > listener.limits.max_connections:
            self._refuse(
                503,
                "This server has as many connections as it takes; retry.",
                RefusalReason.CONNECTIONS,
                listener.limits.max_connections,
            )
            return
        self._await(listener.head)
        listener.watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.connections.discard(self)
        self.listener.check_drained()
        self.due = math.inf
        for exchange in (self._current, self._reading, *self._waiting):
            if exchange is not None:
                exchange.disconnect()
        self._waiting.clear()
        self.write_paused = False
        self.send_watch.resumed()
        self._wake_drain()

    def data_received(self, data: bytes) -> None:
        if self._lingering or self._read_last:
            return
        if self._between_requests:
            data = skip_empty_lines(data)
            if not data:
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No protocol but HTTP/1.1 is spoken here: the request is served as a plain
            # one, and the connection closes after it: the parser reads no further
            # (on_headers_complete made it the connection's last request).
            self.due = math.inf
            if self._reading is not None:
                self._reading.end()
                self._reading = None
            return
        except httptools.HttpParserError as exc:
            self._unparsable(str(exc))
            return
        # Counted after parsing: a chunk that completes the head may carry body too.
        if self._reading_head and not self._lingering:
            self._head_bytes += len(data)
            limit = self.listener.limits.max_header_bytes
            if self._head_bytes > limit:
                self._refuse(
                    431, f"Request headers over {limit} bytes.", RefusalReason.HEADER_SIZE, limit
                )

    def _unparsable(self, reason: str) -> None:
        """httptools refused what came: a 400 naming what it found wrong (a control byte in
        a header value, say), so that a client can tell which part of its request to fix,
        unless it came after the connection's last request (httptools refuses any byte
        there), which is answered while nothing after it is read (RFC 9112, 9.6)."""
        if not self._read_last:
            message = f"Invalid HTTP request received: {reason.rstrip('.')}."
            self._refuse(400, message, RefusalReason.MALFORMED)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.send_watch.paused(self.loop.time())

    @property
    def reading_paused(self) -> bool:
        """Whether the socket is not read now (flow control, or a pipelined request)."""
        return self._read_paused

    def resume_writing(self) -> None:
        self.write_paused = False
        self.send_watch.resumed()
        self._wake_drain()

    # -- httptools' callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._requested = True
        self._between_requests = False
        self._target = b""
        self._headers = []
        self._expect_continue = False
        self._content_length = None
        self._hosts = 0
        self._transfer_encoding = None
        if not self._reading_head:
            # The next request of a kept-alive connection: its head is timed from its first
            # byte. The first request's is timed from the connection's opening
            # (connection_made), not again here: a client silent, or sending empty lines, for
            # most of the header timeout would get a whole one more for the rest of its head.
            self._reading_head, self._head_bytes = True, 0
            self._await(self.listener.head)

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._reading_head:
            return  # a chunked body's trailer: not one of the request's headers
        name = name.lower()
        if name == b"content-length":
            self._content_length = value
        elif name == b"host":
            self._hosts += 1
        elif name == b"transfer-encoding":
            self._transfer_encoding = value
        elif name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._lingering:
            return  # a request parsed after a refusal, from the same read: never served
        self._reading_head = False
        header_limit = self.listener.limits.max_header_bytes
        head_refusal = head_over(self._target, self._headers, header_limit)
        if head_refusal is not None:
            self._refuse_head(431, head_refusal, RefusalReason.HEADER_SIZE, header_limit)
            return
        parser = self.parser
        version = parser.get_http_version()
        refusal = framing_refusal(
            version, hosts=self._hosts, transfer_encoding=self._transfer_encoding
        )
        if refusal is not None:
            self._refuse_head(*refusal, RefusalReason.FRAMING)
            return
        limit = self.listener.limits.max_body_bytes
        length = self._content_length
        if limit is not None and length is not None and announces_more_than(length, limit):
            self._refuse_head(413, body_over(limit), RefusalReason.BODY_SIZE, limit)
            return
        self._await(self.listener.body)
        path, raw_path, query = split_target(self._target)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "method": parser.get_method().decode("ascii"),
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": self._headers,
            "client": self._client,
            "server": self._server,
        }
        exchange = Exchange(
            self,
            scope,
            # HTTP/1.0 clients get their answer and the connection closes, as with uvicorn.
            keep_alive=version == "1.1" and parser.should_keep_alive(),
            expect_continue=self._expect_continue,
        )
        if self.listener.draining or parser.should_upgrade():
            exchange.keep_alive = False
        self._reading = exchange
        if self._current is None:
            self._current = exchange
            self.listener.start(exchange)
        else:
            self._waiting.append(exchange)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        if self._reading is not None:
            self._reading.feed(body)

    def on_message_complete(self) -> None:
        self._between_requests = True
        self.due = math.inf
        self._body_left_s = None
        if self._reading is not None:
            self._read_last = not self._reading.keep_alive
            self._reading.end()
            self._reading = None
        if self._current is None and not self._lingering:
            # Answered before its body was all here (a refusal that needed none): the
            # connection is idle from now on, as after any other answer.
            self._await(self.listener.idle)

    # -- what an Exchange needs (exchange.Wire) -------------------------------------------

    def pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()
            if self._reading is not None and self._stage is self.listener.body:
                self._body_left_s = max(0.0, self.due - self.loop.time())
                self.due = math.inf

    def resume_reading(self) -> None:
        if self._read_paused and not self._waiting:
            self._read_paused = False
            self.transport.resume_reading()
            body_left_s, self._body_left_s = self._body_left_s, None
            if body_left_s is not None and self._reading is not None:
                self.due = self.loop.time() + body_left_s

    async def drain(self) -> None:
        if self.write_paused:
            if self._drained is None:
                self._drained = self.loop.create_future()
            await self._drained

    def answered(self, exchange: Exchange) -> None:
        if exchange is not self._current:
            return
        if not exchange.keep_alive or self.listener.draining:
            self._current = None
            if self._reading is None:
                self.transport.close()
                return
            # Answered while a body still comes in (a 413 for a chunked body past the
            # limit, with ``connection: close``): the rest is not read for the request;
            # what the client sends until it sees the answer is dropped, so that it does
            # see it rather than a reset.
            self._drop_requests()
            self._linger()
            return
        if self._waiting:
            self._current = self._waiting.popleft()
            self.listener.start(self._current)
            self.resume_reading()
            return
        self._current = None
        self.resume_reading()
        if self._reading is None and not self._reading_head:
            self._await(self.listener.idle)

    # -- limits and shutdown --------------------------------------------------------------

    def overdue(self) -> None:
        """The sweep found this connection past its due time."""
        seconds, what = self._stage
        if what == _IDLE:
            self.due = math.inf
            self.listener.refusals.closed_keepalive()
            self.transport.close()
            return
        if self._stage is self.listener.head and not self._requested:
            # Nothing of a request came, or empty lines only: a connection opened ahead of
            # use (a load balancer's or a proxy's pool), a keep-alive probe or a TCP health
            # check. Nobody asked anything, so nothing is answered and nothing refused; the
            # slot it held is freed all the same.
            self.due = math.inf
            self.listener.refusals.closed_silent()
            self.transport.close()
            return
        reason = (
            RefusalReason.HEADER_TIMEOUT
            if self._stage is self.listener.head
            else RefusalReason.BODY_TIMEOUT
        )
        message = f"{what[0].upper()}{what[1:]} did not arrive within {seconds:g} s."
        self._refuse(408, message, reason, seconds)

    def stalled(self) -> None:
        """The client took in nothing of its answer for ``send_timeout_s``: the connection is
        dropped (its unsent bytes too: no answer could reach it), and the app sees its
        client gone, so the request ends and what it holds (a replica's slot) is freed."""
        self.send_watch.resumed()
        self.transport.abort()

    def check_peer(self) -> None:
        """Reading is paused, so a client that leaves is not seen by reading: ask the socket
        whether the peer closed its side (as reading would have found: the end of the
        stream), and end the connection if so."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or self.transport.is_closing():
            return
        poller = select.poll()
        poller.register(sock.fileno(), _PEER_CLOSED)
        if poller.poll(0):
            self.transport.close()

    def shut_down(self) -> None:
        """The server stops: an idle connection closes now, a busy one after its answer."""
        if self._current is None and self._reading is None:
            self.transport.close()
        elif self._current is not None:
            self._current.keep_alive = False

    def _await(self, stage: _Stage) -> None:
        self._stage = stage
        self.due = self.loop.time() + stage[0]

    def _wake_drain(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _refuse_head(
        self, status: int, message: str, reason: RefusalReason, limit: float | None = None
    ) -> None:
        """Refuse the request whose head was just read (a head over its limit, or one that
        announces a body over its limit). No exchange is made for it, so the app never
        sees it."""
        current = self._current
        if current is None:
            self._refuse(status, message, reason, limit)
            return
        self.listener.refusals.refused(reason, status, self._client, limit)
        # An earlier request, pipelined before this one, is still being answered: no refusal
        # may cut into its answer. The connection closes after it; this request, and any
        # waiting between them, go unanswered (a client retries an unanswered request).
        current.keep_alive = False
        for exchange in self._waiting:
            exchange.disconnect()
        self._waiting.clear()
        self.due = math.inf
        self._lingering = True

    def _refuse(
        self, status: int, message: str, reason: RefusalReason, limit: float | None = None
    ) -> None:
        """Answer ``status`` and close: the listener's own refusal, counted and logged
        (``refusals``) under ``reason``, ``limit`` the one the client ran into."""
        self.due = math.inf
        if self.transport.is_closing() or self._lingering:
            return
        self.listener.refusals.refused(reason, status, self._client, limit)
        current = self._current
        # The request the refusal would answer: the one being answered, or else the one
        # whose body is still coming in, answered already when it needed none of it (a
        # second answer to it would be read as the answer to the next request).
        answering = current if current is not None else self._reading
        if answering is None or not answering.started:
            content_type, body = self.listener.refusal(status, message)
            # At the connection limit, any request that ends frees a place: soon.
            retry_after_s = RETRY_AFTER_S if reason is RefusalReason.CONNECTIONS else None
            self.transport.write(closing_answer(status, content_type, body, retry_after_s))
        if current is not None:
            current.disconnect()
        self._drop_requests()
        self._linger()

    def _drop_requests(self) -> None:
        """The requests still coming in, or waiting behind the one answered, end unserved:
        the app, if it is reading one, sees its client gone; whatever it would still send
        is dropped."""
        for exchange in (self._reading, *self._waiting):
            if exchange is not None:
                exchange.disconnect()
        self._reading = None
        self._waiting.clear()

    def _linger(self) -> None:
        """Close after what was written, in stages: the connection's sending side now (the
        client reads the end of the answer), its receiving side once the client hangs up,
        or after ``LINGER_S``. What still comes meanwhile is dropped unparsed: a socket
        closed with unread bytes resets the connection, and the client may lose the
        answer."""
        self.due = math.inf
        self._lingering = True
        self._read_paused = True  # and never resumed: resume_reading checks _waiting only
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


class HttpServer:
    """One listening socket serving ``app``; ``lifespan``: whether the app gets ASGI's
    lifespan startup and shutdown."""

    def __init__(
        self,
        app: App,
        *,
        limits: ListenerLimits,
        idle_s: float,
        graceful_shutdown_s: float,
        refusal: Refusal = plain_text,
        refusals: ListenerRefusals | None = None,
        lifespan: bool = True,
    ) -> None:
        self._app = app
        self._limits = limits
        self._refusal = refusal
        self.refusals = refusals if refusals is not None else ListenerRefusals("listener")
        """What it refused itself (``app.listeners.refusals``), for ``/metrics``."""
        self._idle_s = idle_s
        self._graceful_shutdown_s = graceful_shutdown_s
        self._lifespan = Lifespan(app) if lifespan else None
        self._listener: _Listener | None = None
        self._server: asyncio.AbstractServer | None = None
        self._stop = asyncio.Event()

    async def start(self, sock: socket.socket) -> None:
        """Start the app's lifespan, then listen on ``sock`` (bound, not yet listening).
        Raises ``LifespanFailed``; ``sock`` is closed then."""
        loop = asyncio.get_running_loop()
        if self._lifespan is not None:
            try:
                await self._lifespan.startup()
            except BaseException:
                sock.close()
                raise
        listener = self._listener = _Listener(
            self._app, self._limits, self._refusal, self.refusals, self._idle_s, loop
        )
        self._server = await loop.create_server(
            lambda: HttpConnection(listener), sock=sock, backlog=2048
        )

    @property
    def connections(self) -> frozenset[HttpConnection]:
        """The connections open now."""
        return frozenset(self._listener.connections if self._listener else ())

    def stop(self) -> None:
        """Ask ``serve()`` to shut down."""
        self._stop.set()

    async def serve(self) -> None:
        """Until ``stop()``; then stop listening, let in-flight requests finish for up to
        ``graceful_shutdown_s`` (cancelled after, with ``CANCELLED_ANSWERS_S`` more to end
        their answers), close idle connections and end the app's lifespan."""
        await self._stop.wait()
        listener, server = self._listener, self._server
        if listener is None or server is None:
            return
        server.close()
        listener.draining = True
        for connection in list(listener.connections):
            connection.shut_down()
        listener.check_drained()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(listener.drained.wait(), self._graceful_shutdown_s)
        for task in list(listener.tasks):
            task.cancel()
        if listener.tasks:
            # A cancelled request may still end its answer (a stream its closing event,
            # saying why it ends there) before its connection closes; for a moment at most.
            await asyncio.wait(list(listener.tasks), timeout=CANCELLED_ANSWERS_S)
        for connection in list(listener.connections):
            connection.transport.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*listener.tasks, return_exceptions=True)
        if self._lifespan is not None:
            await self._lifespan.shutdown()


def _address(address: Any) -> tuple[str, int] | None:
    """A socket's address as ASGI's ``client``/``server`` (host, port)."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None
