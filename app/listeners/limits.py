"""Slow and greedy clients, cut off at the connection, before any app sees them: the limits,
and how they are put on uvicorn (the admin API's server). The gateway's listeners have the
same limits built into their own server (``app.listeners.httpserver``).

uvicorn reads a request's head and body for as long as the client takes to send them: a
client that sends its headers a byte at a time (slowloris) holds its connection, and the
memory behind it, forever, and enough of them hold every connection the process can open.
``limited(protocol, limits)`` is uvicorn's HTTP protocol with four limits added:

- the head (request line and headers) must arrive within ``header_timeout_s`` of the
  connection opening, or of the first byte of the next request on a kept-alive one; a
  connection that begins no request in that time (opened ahead of use by a load balancer,
  a TCP health check: it sends no byte, or empty lines only, which RFC 9112 (2.2) has a
  server ignore before a request) is closed without an answer, and counted apart from the
  refusals (``ListenerRefusals.closed_silent``);
- the body within ``body_timeout_s`` of the head (the listeners' own server leaves out the
  time it does not read the body: ``app.listeners.httpserver``);
- a client that takes in nothing of an answer (the server's send buffer stays full) for
  ``send_timeout_s`` is disconnected, as nginx's ``send_timeout`` does: no answer can reach
  it, and the request it holds ends;
- the head may hold at most ``max_header_bytes``; empty lines before a request are dropped
  as they come, so they count towards no head and are not kept, however many;
- a body its head announces (``Content-Length``) may be at most ``max_body_bytes`` (None:
  no limit here, the app's own): one over it is answered 413 as soon as the head is read,
  before the app sees the request, so a client that sent ``Expect: 100-continue`` gets no
  ``100 Continue`` and is not waited for; the body it may still send is read and dropped;
- the listener holds at most ``max_connections`` connections: one more is answered 503
  at once and closed;
- a head a proxy in front could frame otherwise (``http11.framing_refusal``: no ``Host``
  or two, a ``Transfer-Encoding`` but ``chunked``, a version but 1.0 and 1.1) is answered
  400 (505) before the app sees it; a chunked body's trailer is not added to the
  request's headers.

The timeouts, the keep-alive time below included, are checked by one sweep per listener
every second, or every quarter of the shortest where that is shorter, so a late client is
cut off up to that much after its time: a quarter of its time at most.

A client over a limit gets a short answer (408, 413, 431 or 503 with ``Retry-After``, in the
listener's own error shape) and its connection is closed; nobody else notices. A
connection that began no request asked nothing and is no client over a limit: it is only
closed. Each refusal, and each request uvicorn answers 400 for not parsing, is counted and
logged by reason (``app.listeners.refusals``): uvicorn's own warning for every such
request, which any client could repeat without end, is left out.

The time between requests on a kept-alive connection is ``keep_alive_s``, in place of
uvicorn's keep-alive timeout (``timeout_keep_alive``), from the last answer, or from the
end of a body that came after its answer, timed by the sweep instead of uvicorn's timer:
uvicorn stops its timer at every byte it reads and starts it again only at an answer, so a
client sending an empty line now and then, or the body of a request answered without it,
would hold its connection for ever. A kept-alive connection closed at that time is counted
(``ListenerRefusals.closed_keepalive``), not logged.
"""

from __future__ import annotations

import asyncio
import fcntl
import http
import logging
import math
import sys
import termios
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.listeners.http11 import framing_refusal, retry_after_header, skip_empty_lines
from app.listeners.refusals import RETRY_AFTER_S, ListenerRefusals, RefusalReason

Refusal = Callable[[int, str], tuple[bytes, bytes]]
"""Renders a refusal: the status and a message in, the content type and the body out."""

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_SEND_TIMEOUT_S = 60.0
"""As nginx's ``send_timeout``: a client may take no more than this to take in some of an
answer the server cannot send it faster."""
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_KEEP_ALIVE_S = 5.0
"""How long a kept-alive connection may idle between requests, unless the listener says:
uvicorn's own (``timeout_keep_alive``)."""
_IDLE = "idle"
"""What a connection waits for between requests: the next one, no part of this one."""
LINGER_S = 2.0
"""How long a refused connection is read (and its bytes dropped) before it is closed."""


def unsent_bytes(transport: asyncio.BaseTransport) -> int | None:
    """What the kernel still holds of what was written to ``transport``'s socket, not yet
    taken in by the peer (Linux's ``SIOCOUTQ``); None where that cannot be asked."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return None
    return int.from_bytes(answer, sys.byteorder, signed=True)


class SendWatch:
    """Whether a client whose answer cannot be sent faster still takes some of it in: the
    send timeout runs from the last time it did. Writing pauses when the server's buffer
    is full, and resumes only once the kernel has room for much more (a third of its send
    buffer of several MiB), so a client that reads steadily but slowly can keep writing
    paused for long; what the kernel still holds shows that it reads."""

    __slots__ = ("_unsent", "since")

    def __init__(self) -> None:
        self.since = math.inf
        """When the client was last seen taking nothing in; infinity while writing goes on."""
        self._unsent: int | None = None

    def paused(self, now: float) -> None:
        self.since, self._unsent = now, None

    def resumed(self) -> None:
        self.since, self._unsent = math.inf, None

    def stalled(self, transport: asyncio.BaseTransport, now: float, timeout_s: float) -> bool:
        """Whether the client took in nothing for ``timeout_s``: asked once a sweep, only of
        a connection whose writing is paused."""
        unsent = unsent_bytes(transport)
        if unsent is not None and (self._unsent is None or unsent < self._unsent):
            if self._unsent is not None:
                self.since = now  # it took some in since the last sweep
            self._unsent = unsent
        return now - self.since >= timeout_s


def announces_more_than(content_length: bytes, limit: int) -> bool:
    """Whether a head's ``Content-Length`` value announces a body over ``limit`` bytes.
    The parser has refused a value that is not digits (signs, underscores) already."""
    try:
        return int(content_length) > limit
    except ValueError:
        # Digits alone that int() refuses are thousands of them: far over any limit.
        return content_length.strip().isdigit()


def head_over(target: bytes, headers: Iterable[tuple[bytes, bytes]], limit: int) -> str | None:
    """The refusal's message (431) for a head whose target and fields, as parsed (each
    field's name, value, ``: `` and line end), hold more than ``limit`` bytes; None when
    they fit. Measured once the head is read: counting the reads that leave a head
    unfinished misses one that arrives whole in one read."""
    size = len(target) + sum(len(name) + len(value) + 4 for name, value in headers)
    return f"Request headers over {limit} bytes." if size > limit else None


def body_over(limit: int) -> str:
    """The refusal's message for a body announced over ``limit`` bytes."""
    return f"The request body exceeds {limit} bytes."


_UVICORN_UNPARSABLE = "Invalid HTTP request received."
"""What uvicorn logs, as a warning, for every request it cannot parse (and answers 400)."""


class _WithoutUnparsable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _UVICORN_UNPARSABLE


_UVICORN_LOG = logging.getLogger("uvicorn.error.limited")
"""uvicorn's logger for the limited protocols: its lines go where uvicorn's go, but for the
one per unparsable request, counted and logged throttled instead (``ListenerRefusals``)."""
_UVICORN_LOG.addFilter(_WithoutUnparsable())


def plain_text(status: int, message: str) -> tuple[bytes, bytes]:
    return b"text/plain; charset=utf-8", message.encode() + b"\n"


@dataclass(frozen=True)
class ListenerLimits:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = 1024
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_body_bytes: int | None = None
    """The largest body a head may announce; None: as large as the app takes."""

    def problems(self, connections_flag: str = "--max-connections") -> list[str]:
        """What is wrong with these limits, as messages naming the commands' flags."""
        found = []
        for flag, value in (
            ("--header-timeout", self.header_timeout_s),
            ("--body-timeout", self.body_timeout_s),
            ("--send-timeout", self.send_timeout_s),
        ):
            if not value > 0:
                found.append(f"{flag} must be positive, not {value}")
        if self.max_connections < 1:
            found.append(f"{connections_flag} must be at least 1, not {self.max_connections}")
        if self.max_body_bytes is not None and self.max_body_bytes < 0:
            found.append(f"the body limit must not be negative, not {self.max_body_bytes}")
        return found


def sweep_period_s(limits: ListenerLimits, keep_alive_s: float) -> float:
    """How often one listener's sweep looks for late connections: every second, or every
    quarter of its shortest time where that is shorter, so that none is cut off more than
    a quarter of its time late."""
    return min(
        1.0,
        limits.header_timeout_s / 4,
        limits.body_timeout_s / 4,
        limits.send_timeout_s / 4,
        keep_alive_s / 4,
    )


def limited(
    protocol: type[HttpToolsProtocol],
    limits: ListenerLimits,
    refusal: Refusal = plain_text,
    refusals: ListenerRefusals | None = None,
    *,
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
) -> type[HttpToolsProtocol]:
    """``protocol`` (uvicorn's httptools protocol or a subclass) with ``limits``; pass the
    result as ``uvicorn.Config(http=...)``, one per listener. ``refusals`` counts and logs
    what the listener refuses (its own, when None); ``keep_alive_s`` is how long a
    kept-alive connection may idle between requests (uvicorn's ``timeout_keep_alive`` is
    not used)."""
    counted = refusals if refusals is not None else ListenerRefusals("listener")
    head = (limits.header_timeout_s, "the request's headers")
    body = (limits.body_timeout_s, "the request's body")
    idle = (keep_alive_s, _IDLE)
    sweep_every_s = sweep_period_s(limits, keep_alive_s)

    # mypy cannot check a class whose base is a parameter; HttpToolsProtocol's methods
    # are what is overridden.
    class Limited(protocol):  # type: ignore[valid-type,misc]
        # A request only writes down when its current stage is due; one sweep per listener
        # closes the late ones. A timer per stage would cost every request four calls
        # into the loop (arm and cancel, twice).
        _open: ClassVar[set[Limited]] = set()
        _sweeping: ClassVar[bool] = False
        _due = math.inf
        _stage = head
        _reading_head = True
        _head_bytes = 0
        _requested = False
        """Whether a request has begun on this connection: until one has, what came
        (nothing, or empty lines, which begin none) asked nothing to answer."""
        _between_requests = True
        """No request is begun (none yet, or the last one read whole): empty lines that
        come now are dropped before the parser (``http11.skip_empty_lines``)."""
        _lingering = False
        _send_watch: SendWatch | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.logger = _UVICORN_LOG
            # uvicorn's own timer, armed at an answer until the sweep takes over (``_idle``),
            # runs for the listener's time too, not for its config's.
            self.timeout_keep_alive = keep_alive_s

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._refuse(
                    503,
                    "This server has as many connections as it takes; retry.",
                    RefusalReason.CONNECTIONS,
                    limits.max_connections,
                )
                return
            self._await(head)
            Limited._open.add(self)
            if not Limited._sweeping:
                Limited._sweeping = True
                self.loop.call_later(sweep_every_s, Limited._sweep, self.loop)

        def connection_lost(self, exc: Exception | None) -> None:
            Limited._open.discard(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return
            if self._between_requests:
                data = skip_empty_lines(data)
                if not data:
                    return
            super().data_received(data)
            # Counted after parsing: a chunk that completes the head may carry body too.
            if self._reading_head and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_header_bytes:
                    self._refuse(
                        431,
                        f"Request headers over {limits.max_header_bytes} bytes.",
                        RefusalReason.HEADER_SIZE,
                        limits.max_header_bytes,
                    )

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to a request it cannot parse: counted as the listener's own.
            counted.refused(RefusalReason.MALFORMED, 400, self.client)
            super().send_400_response(msg)

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_watch is None:
                self._send_watch = SendWatch()
            self._send_watch.paused(self.loop.time())

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_watch is not None:
                self._send_watch.resumed()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._requested = True
            self._between_requests = False
            if not self._reading_head:
                # The next request of a kept-alive connection: its head is timed anew.
                self._reading_head, self._head_bytes = True, 0
                self._await(head)

        def on_header(self, name: bytes, value: bytes) -> None:
            # A chunked body's trailer is not one of the request's headers: uvicorn adds it
            # to them, and the app, if it starts after the whole request was parsed, reads
            # an Authorization a proxy in front never saw as a header.
            if self._reading_head:
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._lingering:
                return  # a request parsed after a refusal, from the same read: never served
            self._reading_head = False
            if (
                self._head_too_large()
                or self._framed_two_ways()
                or (
                    limits.max_body_bytes is not None
                    and self._announces_too_much(limits.max_body_bytes)
                )
            ):
                return
            self._await(body)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._lingering:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._between_requests = True
            self._due = math.inf
            if self._lingering:
                return
            super().on_message_complete()
            cycle = self.cycle
            if cycle is not None and cycle.response_complete and not cycle.disconnected:
                # Answered before its body was all here (a refusal that needed none): the
                # connection is idle from now on, as after any other answer. uvicorn's
                # keep-alive timer, armed at the answer, was stopped by the body's bytes.
                self._idle()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if (
                self.timeout_keep_alive_task is not None
                and not self._reading_head
                and self._due == math.inf
            ):
                # uvicorn armed its keep-alive timer: the request was read whole and no next
                # one has begun.
                self._idle()

        def _idle(self) -> None:
            """Time the connection's wait for its next request by the sweep, from now,
            until that request begins (``on_message_begin``), rather than by uvicorn's
            keep-alive timer: that restarts at every byte read, empty lines too, which
            begin no request, and is not restarted once a late body has stopped it."""
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self._await(idle)

        def _head_too_large(self) -> bool:
            """Refuse the request whose head was just read if it is over the header limit
            (``head_over``); whether it was."""
            refusal = head_over(self.url, self.headers, limits.max_header_bytes)
            if refusal is None:
                return False
            self._refuse_head(431, refusal, RefusalReason.HEADER_SIZE, limits.max_header_bytes)
            return True

        def _framed_two_ways(self) -> bool:
            """Refuse the request whose head was just read if a proxy in front could frame
            it otherwise (``http11.framing_refusal``); whether it was."""
            hosts = 0
            transfer_encoding = None
            for name, value in self.headers:
                if name == b"host":
                    hosts += 1
                elif name == b"transfer-encoding":
                    transfer_encoding = value
            refusal = framing_refusal(
                self.parser.get_http_version(), hosts=hosts, transfer_encoding=transfer_encoding
            )
            if refusal is None:
                return False
            self._refuse_head(*refusal, RefusalReason.FRAMING)
            return True

        def _announces_too_much(self, limit: int) -> bool:
            """Refuse the request whose head was just read if it announces a body over
            ``limit``; whether it did. The app never sees it."""
            lengths = [value for name, value in self.headers if name == b"content-length"]
            if not any(announces_more_than(value, limit) for value in lengths):
                return False
            self._refuse_head(413, body_over(limit), RefusalReason.BODY_SIZE, limit)
            return True

        def _refuse_head(
            self, status: int, message: str, reason: RefusalReason, limit: float | None = None
        ) -> None:
            """Refuse the request whose head was just read; the app never sees it."""
            previous = self.cycle
            if previous is not None and not previous.response_complete:
                counted.refused(reason, status, self.client, limit)
                # An earlier request, pipelined before this one, is still being answered:
                # no refusal may cut into its answer. The connection closes after it, and
                # this request goes unanswered (a client retries an unanswered request).
                previous.keep_alive = False
                self._due = math.inf
                self._lingering = True
                return
            self._refuse(status, message, reason, limit, started=False)

        def _await(self, stage: tuple[float, str]) -> None:
            self._stage = stage
            self._due = self.loop.time() + stage[0]

        @staticmethod
        def _sweep(loop: asyncio.AbstractEventLoop) -> None:
            now = loop.time()
            for connection in [c for c in Limited._open if c._due <= now]:
                if connection._stage is head and not connection._requested:
                    connection._close_silent()
                    continue
                seconds, what = connection._stage
                if what == _IDLE:
                    connection._close_idle()
                    continue
                connection._refuse(
                    408,
                    f"{what[0].upper()}{what[1:]} did not arrive within {seconds:g} s.",
                    RefusalReason.HEADER_TIMEOUT
                    if connection._stage is head
                    else RefusalReason.BODY_TIMEOUT,
                    seconds,
                )
            for connection in list(Limited._open):
                watch = connection._send_watch
                if (
                    watch is not None
                    and watch.since < now
                    and watch.stalled(connection.transport, now, limits.send_timeout_s)
                ):
                    # The client took in nothing of its answer for the send timeout: dropped,
                    # unsent bytes and all (no answer could reach it); the app sees it gone.
                    Limited._open.discard(connection)
                    watch.resumed()
                    connection.transport.abort()
            Limited._sweeping = bool(Limited._open)
            if Limited._sweeping:
                loop.call_later(sweep_every_s, Limited._sweep, loop)

        def _close_idle(self) -> None:
            """A kept-alive connection began no next request within the keep-alive time:
            closed, as uvicorn's timer would, and counted."""
            self._due = math.inf
            Limited._open.discard(self)
            if self.transport.is_closing():
                return
            counted.closed_keepalive()
            self.transport.close()

        def _close_silent(self) -> None:
            """Nothing of a request came within the header timeout, or empty lines only: a
            connection opened ahead of use (a load balancer's or a proxy's pool), a
            keep-alive probe or a TCP health check. Nobody asked anything, so nothing is
            answered and nothing refused; the slot it held is freed all the same."""
            self._due = math.inf
            Limited._open.discard(self)
            if self.transport.is_closing():
                return  # closed already, for whatever came instead (uvicorn's own 400)
            counted.closed_silent()
            self.transport.close()

        def _refuse(
            self,
            status: int,
            message: str,
            reason: RefusalReason,
            limit: float | None = None,
            *,
            started: bool = True,
        ) -> None:
            """``started``: whether the request refused has a cycle (``self.cycle``); one
            refused at its head has none, and ``self.cycle`` is the previous request's.
            Counted and logged under ``reason``, ``limit`` the one the client ran into."""
            self._due = math.inf
            Limited._open.discard(self)
            if self.transport.is_closing() or self._lingering:
                return
            counted.refused(reason, status, self.client, limit)
            cycle = self.cycle if started else None
            if cycle is None or not cycle.response_started:
                content_type, body = refusal(status, message)
                phrase = http.HTTPStatus(status).phrase.encode()
                # At the connection limit, any request that ends frees a place: soon.
                retry_after = (
                    b"retry-after: %s\r\n" % retry_after_header(RETRY_AFTER_S)
                    if reason is RefusalReason.CONNECTIONS
                    else b""
                )
                self.transport.write(
                    b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
                    b"%sconnection: close\r\n\r\n%s"
                    % (status, phrase, content_type, len(body), retry_after, body)
                )
            if cycle is not None and not cycle.response_complete:
                # The app, if it is reading this request, sees its client gone; whatever
                # it would still send is dropped.
                cycle.disconnected = True
                cycle.message_event.set()
            # Closed outright, a socket with unread bytes from the client resets the
            # connection, and the client may lose the answer: what still comes is read and
            # dropped until the client hangs up, for LINGER_S at most.
            self._lingering = True
            self.flow.resume_reading()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

    Limited.__name__ = Limited.__qualname__ = f"Limited{protocol.__name__}"
    return Limited
