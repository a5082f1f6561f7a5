"""A lean HTTP/1.1 client for the one request the gateway sends most: a POST to an engine.

Why not aiohttp, which the gateway uses to scrape engine metrics: on this path it cost
about 260 us of CPU per request against 50 us for this client (measured against the
simulator on uvloop; see docs/performance.md), which was most of what the gateway added.
This client does only what forwarding needs: keep-alive connections pooled per engine,
one write per request (head and body together), answers parsed by httptools (the parser
uvicorn serves with), bodies handed over as they arrive, with back-pressure.

    answer = await client.post("http://10.0.0.7:8001", "/v1/chat/completions", body, rid)
    try:
        async for chunk in answer.chunks(): ...     # or: await answer.read()
    finally:
        answer.close()        # a finished answer's connection is back in the pool already;
                              # an unfinished one is closed, which aborts it in the engine

What an engine sends is read as hostile input, since it may be buggy, compromised, or
some other program on its port (docs/gateway.md, "What an engine may send"): an answer's
head (status line and headers, interim answers included) is at most ``MAX_HEAD_BYTES``;
interim answers (100 Continue, 103 Early Hints) are skipped; 101 and a status outside
100..599 are refused; an answer read whole (``read``) is at most ``MAX_ANSWER_BYTES``. Each
refusal closes the connection. An error answer (a status of 400 and up) is at most
``MAX_ERROR_BYTES``.

Time is bounded too (``EngineTimeouts``), as nginx's ``proxy_read_timeout`` and Envoy's
idle timeouts do: the answer's head, and the first piece of its body, must come within
``head_s`` of the request (of its body's end, for an upload, whose body the engine may
leave unread for at most ``idle_s``); then the engine may be silent for at most ``idle_s``
between pieces. The gateway not reading (its client is slow) does not
count as the engine's silence. Past a bound the connection is closed, which aborts the
request in the engine. One timer per connection does it: each piece that arrives only notes
the time, and the timer, when it fires, sees whether the engine was silent for the whole
bound or sets itself again for the end of the new silence. A kept-alive connection keeps
its timer from one answer to the next, so requests in a row set one about once per bound.

Exceptions::

    EngineUnreachable   no answer head: connecting failed, or the connection dropped first
    └── HeadRefused     a head the gateway does not relay: too large, 101, an odd status
    HeadTimedOut        no answer head within ``head_s`` (or an upload unread for ``idle_s``)
    AnswerBroken        the connection dropped, or sent garbage, in the middle of an answer
    ├── AnswerTooLarge  an answer read whole is over ``MAX_ANSWER_BYTES``
    └── AnswerStalled   the engine sent nothing more of its answer within its bound
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import NoReturn, cast
from urllib.parse import urlsplit

import httptools

KEEPALIVE_S = 4.0
"""Idle connections older than this are not reused: engines served by uvicorn (vLLM,
SGLang) close theirs after 5 s, and a request must not race that close."""
HIGH_WATER_BYTES = 1 << 20
"""Stop reading from the engine while this much of its answer waits for the client."""
LOW_WATER_BYTES = 1 << 18
MAX_HEAD_BYTES = 64 << 10
"""An answer's head, interim answers before it included: as much as the gateway's listener
takes of a client's request head. Engines send a few hundred bytes."""
MAX_ANSWER_BYTES = 256 << 20
"""An answer read whole (not streamed), which the gateway holds in memory before sending it
on. Eight times the largest request body it takes (32 MiB), and far over what engines
answer: a batch of 2,048 embeddings of 3,072 dimensions in JSON is about 130 MB. A stream
is not bounded: it passes through at the client's pace, never held whole."""
MAX_ERROR_BYTES = 1 << 20
"""An error answer (a status of 400 and up), read whole to be put in OpenAI's shape: engines
send a few hundred bytes, and only the first 2,000 characters of its message are kept."""

DEFAULT_HEAD_TIMEOUT_S = 600.0
"""An answer's head (and a stream's first piece) within this of the request: a request
that is not streamed is answered only once it is generated whole, after however long it
waited in the engine's queue. The ``openai`` SDK waits as long by default before it gives
up, so an answer it would still take is never cut off."""
DEFAULT_IDLE_TIMEOUT_S = 120.0
"""Silence between pieces of an answer once they have begun: an engine generating sends a
piece every few tens of milliseconds; one that preempts a request to make room for others
(vLLM, when its KV cache runs short) may pause it for seconds to a minute."""
MAX_TIMEOUT_S = 86400.0


@dataclass(frozen=True)
class EngineTimeouts:
    """How long an engine may take to answer, and be silent once it has begun."""

    head_s: float = DEFAULT_HEAD_TIMEOUT_S
    idle_s: float = DEFAULT_IDLE_TIMEOUT_S

    def problems(self) -> list[str]:
        """What is wrong with these bounds, as messages naming the commands' flags."""
        return [
            f"{flag} must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds, not {value:g}"
            for flag, value in (
                ("--engine-head-timeout", self.head_s),
                ("--engine-idle-timeout", self.idle_s),
            )
            if not 0 < value <= MAX_TIMEOUT_S
        ]


OnTimeout = Callable[[str], None]
"""Told of each bound an engine overran: ``"head"`` or ``"idle"``."""


class EngineUnreachable(Exception):
    """No answer head: connecting failed, or the connection dropped first."""


class HeadRefused(EngineUnreachable):
    """The engine's answer head is one the gateway does not relay (its connection is
    closed): over ``MAX_HEAD_BYTES``, 101 Switching Protocols, or a status outside
    100..599."""


class HeadTimedOut(Exception):
    """No answer head within the head bound (the connection is closed). Not an
    ``EngineUnreachable``: the engine has the request, and may have worked on it, so it is
    not sent again."""

    def __init__(self, timeout_s: float, message: str | None = None, bound: str = "head") -> None:
        super().__init__(message or f"the engine did not answer within {timeout_s:g} s")
        self.timeout_s = timeout_s
        self.bound = bound
        """``"head"``, or ``"idle"``: the engine stopped reading an upload's body."""


class AnswerBroken(Exception):
    """The connection dropped, or sent garbage, in the middle of an answer."""


class AnswerTooLarge(AnswerBroken):
    """An answer read whole is over ``MAX_ANSWER_BYTES``, or an error answer over
    ``MAX_ERROR_BYTES`` (its connection is closed)."""


class AnswerStalled(AnswerBroken):
    """The engine sent nothing more of an answer within its bound (the connection is
    closed): its first piece within the head bound, a later one within the idle bound."""

    def __init__(self, message: str, bound: str, timeout_s: float) -> None:
        super().__init__(message)
        self.bound = bound
        """``"head"`` (its first piece) or ``"idle"`` (a later one)."""
        self.timeout_s = timeout_s


class EngineAnswer:
    """An engine's answer whose head has arrived; its body is read as it comes."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_connection",
        "_done",
        "_error",
        "_head",
        "_length",
        "_waiter",
        "content_type",
        "status",
    )

    def __init__(self, connection: _Connection) -> None:
        self.status = 0
        self.content_type = b""
        self._connection: _Connection | None = connection
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self._head: asyncio.Future[None] = connection.loop.create_future()
        self._length = -1
        """The body's declared length (``content-length``); -1: none."""
        self._waiter: asyncio.Future[None] | None = None

    async def read(self) -> bytes:
        """The whole body; ``AnswerTooLarge`` (and the connection closed) past
        ``MAX_ANSWER_BYTES`` (``MAX_ERROR_BYTES`` for an error answer), at once when its
        declared length says so."""
        limit = MAX_ANSWER_BYTES if self.status < 400 else MAX_ERROR_BYTES
        if self._length > limit:
            self._too_large(limit, f"declares {self._length} bytes")
        parts = []
        size = 0
        while (chunk := await self._next()) is not None:
            size += len(chunk)
            if size > limit:
                self._too_large(limit, "goes on past it")
            parts.append(chunk)
        return b"".join(parts)

    def _too_large(self, limit: int, how: str) -> NoReturn:
        self.close()
        what = "answer" if limit == MAX_ANSWER_BYTES else f"error answer (HTTP {self.status})"
        raise AnswerTooLarge(
            f"the engine's {what} is over {limit >> 20} MiB, the most the gateway "
            f"reads whole (it {how})"
        )

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces, as the engine sends them."""
        while True:
            chunk = await self._next()
            if chunk is None:
                return
            yield chunk

    @property
    def ended(self) -> bool:
        """Whether the body is all read and handed over: the next piece is none."""
        return self._done and not self._chunks

    async def _next(self) -> bytes | None:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                connection = self._connection
                if connection is not None and self._buffered <= LOW_WATER_BYTES:
                    connection.resume()
                return chunk
            if self._done:
                return None
            if self._error is not None:
                raise self._error
            self._waiter = self._head.get_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        """Done with the answer: an unfinished one's connection is closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abandon()

    # -- called by the connection ------------------------------------------------------------

    def _started(self, status: int) -> None:
        self.status = status
        if not self._head.done():
            self._head.set_result(None)

    def _body(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > HIGH_WATER_BYTES and self._connection is not None:
            self._connection.pause()
        self._wake()

    def _finished(self) -> None:
        self._done = True
        self._connection = None
        self._wake()

    def _failed(self, error: BaseException) -> None:
        self._connection = None
        if not self._head.done():
            unreachable = (
                error
                if isinstance(error, (EngineUnreachable, HeadTimedOut))
                else EngineUnreachable(str(error))
            )
            self._head.set_exception(unreachable)
            # Nobody may await the head any more (a cancelled request): no warning for it.
            self._head.exception()
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one answer at a time."""

    def __init__(self, origin: _Origin) -> None:
        self._origin = origin
        # Kept, for the futures of each answer on this connection: asyncio's
        # get_running_loop() asks the kernel for the process id on every call.
        self.loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: EngineAnswer | None = None
        self._received = False
        self._paused = False
        self._length_known = False
        self._in_head = False
        """The answer's head is being read: ``_head_room`` bytes more may come."""
        self._head_room = 0
        self._interim = False
        """The message being read is an interim answer (1xx), to be skipped."""
        self._writable: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        """Set while an answer is awaited, and (kept alive) until it fires after one."""
        self._due = 0.0
        """When ``_timer`` fires (``loop.time()``)."""
        self._asked_at = 0.0
        """When the answer's clock started (``loop.time()``): the request, or its body, sent."""
        self._heard_at = 0.0
        """When the engine last sent something, or the gateway resumed reading it."""
        self._body_begun = False
        self.reusable = True
        """False for an upload's: it may end with its request half sent."""
        self.closed = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, but is one).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._received = True
        self._heard_at = self.loop.time()
        if self._in_head:
            room = self._head_room
            self._head_room = room - len(data)
            if len(data) > room:
                self._head_overflows(data, room)
                return
        # Fed here rather than through ``_feed``: a call less for every piece of a stream.
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._unreadable(exc)

    def _head_overflows(self, data: bytes, room: int) -> None:
        """More came than the head has room for: what fits is fed, and what comes after it
        only if the head ended within it."""
        self._feed(data[:room])
        if self._in_head:
            self._refuse(
                f"the engine's answer head (status line and headers) is over "
                f"{MAX_HEAD_BYTES >> 10} KiB"
            )
        elif not self.closed:
            self._feed(data[room:])

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._unreadable(exc)

    def _unreadable(self, exc: Exception) -> None:
        # An upgrade (101) was refused already; anything else is garbage.
        self._fail(AnswerBroken(f"unreadable answer from the engine: {exc}"))
        self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_clock()
        self.resume_writing()
        self._origin.forget(self)
        answer = self._answer
        if answer is None:
            return
        if answer.status and not self._length_known:
            # An answer with neither a length nor chunks ends when the connection does.
            self._answer = None
            answer._finished()
            return
        reason = str(exc) if exc is not None else "the engine closed the connection"
        self._fail(AnswerBroken(reason))

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._length_known = False
        if self._answer is None:
            # An answer nobody asked for: this connection cannot be trusted with the next.
            self._close()

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type" and self._answer is not None:
            self._answer.content_type = value
        elif name == b"content-length":
            self._length_known = True
            if self._answer is not None and value.isdigit():
                self._answer._length = int(value)
        elif name == b"transfer-encoding":
            self._length_known = True

    def on_headers_complete(self) -> None:
        answer = self._answer
        if answer is None:
            return
        status = self._parser.get_status_code()
        if status < 200 or status > 599:
            if status < 100 or status > 599 or status == 101:
                self._refuse(
                    f"the engine answered status {status:03d}, which the gateway does not relay"
                )
                return
            # 100 Continue, 103 Early Hints: the answer is still to come. What the interim
            # head said is not the answer's.
            self._interim = True
            answer.content_type = b""
            answer._length = -1
            return
        self._in_head = False
        answer._started(status)

    def on_body(self, body: bytes) -> None:
        self._body_begun = True
        if self._answer is not None:
            self._answer._body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        answer, self._answer = self._answer, None
        if answer is None:
            return
        answer._finished()
        if self._paused:
            self.resume()
        if self._parser.should_keep_alive() and self.reusable:
            self._origin.put(self)
        else:
            self._close()

    # -- used by the client and the answer ------------------------------------------------

    def send(self, request: bytes, answer: EngineAnswer, *, whole: bool = True) -> None:
        """Send ``request`` for ``answer``; ``whole``: all of it, so the answer's clock
        starts (else ``start_clock`` once the rest is written)."""
        assert self._transport is not None
        self._answer = answer
        self._received = False
        self._body_begun = False
        self._in_head = True
        self._head_room = MAX_HEAD_BYTES
        self._transport.write(request)
        if whole:
            self.start_clock()

    def start_clock(self) -> None:
        """The request is all sent: its answer's head is due within the head bound.

        A kept-alive connection's timer, still set from an answer before, is kept when it
        fires no later than this answer's bound: firing early, it only sets itself again.
        So a connection carrying request after request sets a timer about once per bound,
        not once per request."""
        self._asked_at = now = self.loop.time()
        timeouts = self._origin.timeouts
        # No further off than an idle bound: the body may begin before the head bound ends.
        due = now + min(timeouts.head_s, timeouts.idle_s)
        if self._timer is not None:
            if self._due <= due:
                return
            self._timer.cancel()
        self._due = due
        self._timer = self.loop.call_at(due, self._check_silence)

    def _stop_clock(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _check_silence(self) -> None:
        """The timer fired: fail the answer if the engine was silent past its bound, else
        set the timer for the end of the silence since it last spoke."""
        self._timer = None
        answer = self._answer
        if answer is None or self.closed:
            return
        timeouts = self._origin.timeouts
        now = self.loop.time()
        if not self._body_begun:
            due = self._asked_at + timeouts.head_s
            if now < due:
                # Looked at again within an idle bound, so that once the body begins its
                # silences are seen in time.
                due = min(due, now + timeouts.idle_s)
        elif self._paused:
            due = now + timeouts.idle_s  # the gateway is not reading: the engine is not silent
        else:
            due = self._heard_at + timeouts.idle_s
        if now < due:
            self._due = due
            self._timer = self.loop.call_at(due, self._check_silence)
            return
        error: Exception
        if answer.status == 0:
            error = HeadTimedOut(timeouts.head_s)
        elif not self._body_begun:
            error = AnswerStalled(
                f"the engine sent nothing of its answer's body within {timeouts.head_s:g} s "
                "of the request",
                "head",
                timeouts.head_s,
            )
        else:
            error = AnswerStalled(
                f"the engine sent nothing for {timeouts.idle_s:g} s", "idle", timeouts.idle_s
            )
        self._origin.on_timeout("idle" if self._body_begun else "head")
        self._fail(error)
        self._close()

    async def write(self, data: bytes) -> None:
        """Write more of a request; returns once the transport can take more (the engine
        reads at its pace: an upload waits for it instead of piling up in memory)."""
        if self.closed or self._transport is None:
            return
        self._transport.write(data)
        if self._writable is not None:
            idle_s = self._origin.timeouts.idle_s
            try:
                async with asyncio.timeout(idle_s):
                    await asyncio.shield(self._writable)
            except TimeoutError:
                if self.answer_started or self.closed:
                    return  # the engine answered (before reading it all), or went away
                # Not reading the request is the engine's silence as much as not answering.
                self._origin.on_timeout("idle")
                message = f"the engine did not read the request for {idle_s:g} s"
                self._fail(HeadTimedOut(idle_s, message, bound="idle"))
                self._close()

    @property
    def answer_started(self) -> bool:
        """The answer's head is in (an engine may answer before it has read the request)."""
        return self._answer is None or self._answer.status != 0

    @property
    def received_anything(self) -> bool:
        return self._received

    def abandon(self) -> None:
        """The answer's reader gave up before its end: nothing else can use this connection."""
        self._answer = None
        self._close()

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._heard_at = self.loop.time()  # the engine's silence counts from now
            self._transport.resume_reading()

    def _fail(self, error: BaseException) -> None:
        self._in_head = False
        answer, self._answer = self._answer, None
        if answer is not None:
            answer._failed(error)

    def _refuse(self, reason: str) -> None:
        """The answer's head is not one to relay: it fails, and the connection closes."""
        self._fail(HeadRefused(reason))
        self._close()

    def _close(self) -> None:
        self.closed = True
        self._stop_clock()
        if self._transport is not None:
            self._transport.close()


class _Origin:
    """The pool of connections to one engine."""

    def __init__(
        self,
        base_url: str,
        connect_timeout_s: float,
        timeouts: EngineTimeouts,
        on_timeout: OnTimeout,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        secure = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if secure else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if secure else None
        self.prefix = parts.path.rstrip("/").encode()
        self.host_header = parts.netloc.encode("idna")
        self._connect_timeout_s = connect_timeout_s
        self.timeouts = timeouts
        self.on_timeout = on_timeout
        self._idle: list[_Connection] = []
        self._retired = False

    async def connection(self) -> tuple[_Connection, bool]:
        """An idle connection (and ``True``), or a new one (and ``False``)."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < KEEPALIVE_S:
                return connection, True
            connection.abandon()
        return await self.new_connection(), False

    async def new_connection(self) -> _Connection:
        """A connection of its own, never an idle one: an upload that has started cannot be
        sent again on another if a reused connection turns out to be closed."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError:
            raise EngineUnreachable(
                f"timed out connecting to {self.host}:{self.port} "
                f"after {self._connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise EngineUnreachable(
                f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
            ) from exc
        return connection

    def put(self, connection: _Connection) -> None:
        if self._retired:
            connection.abandon()
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        """Close the idle connections; a busy one closes when its answer is done."""
        self._retired = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abandon()


class EngineClient:
    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        timeouts: EngineTimeouts | None = None,
        on_timeout: OnTimeout = lambda bound: None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._timeouts = timeouts or EngineTimeouts()
        self._on_timeout = on_timeout
        self._origins: dict[str, _Origin] = {}

    async def post(self, base_url: str, path: str, body: bytes, request_id: str) -> EngineAnswer:
        """POST ``body`` (JSON) to ``base_url + path``; returns once the answer's head is in.

        A reused connection that the engine closed before answering is replaced by a new
        one, once: the engine never saw the request. ``HeadTimedOut`` when no head came
        within the head bound.
        """
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origin(base_url)
        request = (
            b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nx-request-id: %s\r\n\r\n%s"
            % (
                origin.prefix,
                path.encode(),
                origin.host_header,
                len(body),
                request_id.encode(),
                body,
            )
        )
        while True:
            connection, reused = await origin.connection()
            answer = EngineAnswer(connection)
            connection.send(request, answer)
            try:
                await answer._head
            except EngineUnreachable:
                if reused and not connection.received_anything:
                    continue
                raise
            except BaseException:
                answer.close()
                raise
            return answer

    async def upload(
        self,
        base_url: str,
        path: str,
        content_type: bytes,
        content_length: int | None,
        body: AsyncGenerator[bytes, None],
        request_id: str,
    ) -> EngineAnswer:
        """POST a body that arrives as it is read from ``body`` (an upload), at the engine's
        pace; returns once the answer's head is in. ``content_length`` None sends the body
        chunked. An engine that answers before the body is all sent (a refusal) stops the
        sending; the answer is what it said.

        ``EngineUnreachable`` before anything of ``body`` was read means nothing was sent;
        whatever ``body`` raises (the client left, the upload is too large) is raised here,
        and the connection is closed."""
        origin = self._origin(base_url)
        connection = await origin.new_connection()
        connection.reusable = False
        framing = (
            b"transfer-encoding: chunked"
            if content_length is None
            else b"content-length: %d" % content_length
        )
        head = (
            b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-type: %s\r\n%s\r\nx-request-id: %s\r\n\r\n"
            % (
                origin.prefix,
                path.encode(),
                origin.host_header,
                content_type,
                framing,
                request_id.encode(),
            )
        )
        answer = EngineAnswer(connection)
        connection.send(head, answer, whole=False)
        try:
            # Closed when left early (the engine answered first), so the client's reader
            # stops where it is.
            async with contextlib.aclosing(body) as pieces:
                async for chunk in pieces:
                    if connection.answer_started or connection.closed:
                        break
                    if not chunk:
                        continue
                    if content_length is None:
                        chunk = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    await connection.write(chunk)
                else:
                    if content_length is None:
                        await connection.write(b"0\r\n\r\n")
            if not connection.closed:
                connection.start_clock()
            await answer._head
        except BaseException:
            answer.close()
            raise
        return answer

    def _origin(self, base_url: str) -> _Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = _Origin(
                base_url, self._connect_timeout_s, self._timeouts, self._on_timeout
            )
        return origin

    @property
    def pooled(self) -> frozenset[str]:
        """The engines (base URLs) it keeps a pool of connections to."""
        return frozenset(self._origins)

    def keep_only(self, base_urls: Collection[str]) -> None:
        """Close and forget the pools of every engine but ``base_urls`` (those still routed
        to): idle connections close now, busy ones when their answer is done."""
        for base_url in [url for url in self._origins if url not in base_urls]:
            self._origins.pop(base_url).close()

    def close(self) -> None:
        """Close the idle connections (answers in progress close their own)."""
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()
