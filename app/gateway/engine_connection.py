"""One keep-alive connection to an engine (an asyncio protocol), carrying one answer at a
time: it writes the request, feeds what the engine sends to httptools' parser (the one
uvicorn serves with), and hands the answer's head and body pieces to its ``EngineAnswer``
(what it needs of one is an ``AnswerSink``).

It skips interim answers (100 Continue, 103 Early Hints) and refuses an answer head over
``MAX_HEAD_BYTES``, 101, a status outside 100..599, a version but HTTP/1.0 and 1.1, or one
httptools cannot read as one answer (two lengths, a length and chunks, bare line ends, a
folded line); each refusal closes the connection. So does any byte that comes while no answer is
awaited, or after one in the same read: an answer to no request, never handed to the next.

It keeps the engine to its ``EngineTimeouts`` (``app.gateway.engine_bounds``): past a bound
the connection is closed, which aborts the request in the engine. One timer per connection
does it: each piece that arrives only notes the time, and the timer, when it fires, sees
whether the engine was silent for the whole bound or sets itself again for the end of the
new silence. A kept-alive connection keeps its timer from one answer to the next, so
requests in a row set one about once per bound.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol, cast

import httptools

from app.gateway.engine_bounds import MAX_HEAD_BYTES
from app.gateway.engine_errors import AnswerBroken, AnswerStalled, HeadRefused, HeadTimedOut

if TYPE_CHECKING:
    from app.gateway.engine_client import EngineOrigin

SPOKEN_VERSIONS = frozenset({"1.0", "1.1"})
"""The HTTP versions of an engine's answer the gateway reads."""


class AnswerSink(Protocol):
    """What the connection fills in as the engine answers (``EngineAnswer``): the head's
    fields, then one call per event of the answer, in this order: ``started`` once, then
    ``received`` for each piece of the body, then ``finished`` or ``failed`` (which may also
    come before ``started``). Nothing is called after ``finished`` or ``failed``."""

    status: int
    """0 until ``started``."""
    content_type: bytes
    declared_length: int
    """The body's ``content-length``; -1: none."""

    def started(self, status: int) -> None:
        """The head is in, with ``status`` (never an interim 1xx)."""

    def received(self, chunk: bytes) -> None:
        """A piece of the body."""

    def finished(self) -> None:
        """The body is all in."""

    def failed(self, error: BaseException) -> None:
        """The answer broke off, or never came, with ``error``."""


class EngineConnection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one answer at a time."""

    def __init__(self, origin: EngineOrigin) -> None:
        self._origin = origin
        # Kept, for the futures of each answer on this connection: asyncio's
        # get_running_loop() asks the kernel for the process id on every call.
        self.loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: AnswerSink | None = None
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
        # An upgrade (101) was refused already; anything else is garbage. Garbage before the
        # head is done (two lengths, a length and chunks, a bare line end) is a head the
        # gateway does not relay: the engine was reached, and answered what is not HTTP.
        answer = self._answer
        if answer is not None and answer.status == 0:
            self._refuse(f"the engine's answer head is not HTTP the gateway reads: {exc}")
            return
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
            answer.finished()
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
                self._answer.declared_length = int(value)
        elif name == b"transfer-encoding":
            self._length_known = True

    def on_headers_complete(self) -> None:
        answer = self._answer
        if answer is None:
            return
        version = self._parser.get_http_version()
        if version not in SPOKEN_VERSIONS:
            # httptools reads HTTP/2.0 and HTTP/0.9 status lines too: a head in another HTTP
            # is not one to read as if it were HTTP/1.1.
            self._refuse(f"the engine answered in HTTP/{version}, not HTTP/1.1 or HTTP/1.0")
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
            answer.declared_length = -1
            return
        self._in_head = False
        answer.started(status)

    def on_body(self, body: bytes) -> None:
        self._body_begun = True
        if self._answer is not None:
            self._answer.received(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        answer, self._answer = self._answer, None
        if answer is None:
            return
        answer.finished()
        if self._paused:
            self.resume()
        if self._parser.should_keep_alive() and self.reusable:
            self._origin.put(self)
        else:
            self._close()

    # -- used by the client and the answer ------------------------------------------------

    def send(self, request: bytes, answer: AnswerSink, *, whole: bool = True) -> None:
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
            answer.failed(error)

    def _refuse(self, reason: str) -> None:
        """The answer's head is not one to relay: it fails, and the connection closes."""
        self._fail(HeadRefused(reason))
        self._close()

    def _close(self) -> None:
        self.closed = True
        self._stop_clock()
        if self._transport is not None:
            self._transport.close()
