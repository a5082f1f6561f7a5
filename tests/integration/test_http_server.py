"""The listeners' own HTTP/1.1 server over real loopback sockets, on the test's loop.

A small ASGI app echoes what it is sent, or holds its answer until the test lets it go;
raw clients speak HTTP byte for byte: kept-alive and pipelined requests, bodies by length
and in chunks, streamed answers, HTTP/1.0, ``Expect: 100-continue``, broken and oversized
requests, clients that leave, idle connections, a full listener, a graceful shutdown and
the app's lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.listeners.exchange import (
    HIGH_WATER_BYTES,
    ON_DISCONNECT,
    ClientGone,
    Exchange,
    Message,
    Receive,
    Scope,
    Send,
)
from app.listeners.httpserver import HttpConnection, HttpServer
from app.listeners.lifespan import LifespanFailed
from app.listeners.limits import ListenerLimits
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

LIMITS = ListenerLimits(header_timeout_s=5, body_timeout_s=5, max_connections=8)


@dataclass
class Echo:
    """Answers each request with its method, path, query and body; ``/hold`` waits for
    ``release``, ``/stream`` sends three events as a chunked stream, ``/fail`` raises,
    ``/notify`` asks to be told when its client leaves (``gone``) and waits for
    ``release``, ``/close`` answers 413 and ``connection: close`` without reading the
    body, ``/last-word`` starts a stream and, cancelled, ends it with a last event."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[Scope] = field(default_factory=list)
    after_body: list[Message] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    cancelled: int = 0
    lifespan: list[str] = field(default_factory=list)
    read_body: bool = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.lifespan.append(message["type"])
                await send({"type": f"{message['type']}.complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        self.seen.append(scope)
        path = scope["path"]
        if path == "/later":
            await self.release.wait()
        if path == "/close":
            headers = [(b"connection", b"close"), (b"content-length", b"8")]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": b"too long"})
            return
        body = await read_all(receive) if self.read_body else b""
        if path == "/fail":
            raise RuntimeError("the app broke")
        if path == "/hold":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if path == "/notify":
            scope["extensions"][ON_DISCONNECT](lambda: self.gone.append(path))
            await self.release.wait()
        if path == "/watch":
            self.after_body.append(await receive())
            return
        if path == "/last-word":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                await send({"type": "http.response.body", "body": b"data: cut off\n\n"})
                raise
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await self.release.wait()
            for n in range(3):
                await send(
                    {"type": "http.response.body", "body": b"data: %d\n\n" % n, "more_body": True}
                )
            await send({"type": "http.response.body", "body": b""})
            return
        answer = b"%s %s?%s %s" % (
            scope["method"].encode(),
            scope["raw_path"],
            scope["query_string"],
            body,
        )
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def read_all(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return body
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


@asynccontextmanager
async def serving(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    *,
    limits: ListenerLimits = LIMITS,
    idle_s: float = 30,
    graceful_shutdown_s: float = 5,
    lifespan: bool = True,
) -> AsyncIterator[tuple[HttpServer, int]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = HttpServer(
        app,
        limits=limits,
        idle_s=idle_s,
        graceful_shutdown_s=graceful_shutdown_s,
        lifespan=lifespan,
    )
    await server.start(sock)
    serve = asyncio.create_task(server.serve())
    try:
        yield server, port
    finally:
        server.stop()
        await asyncio.wait_for(serve, 30)


class Client:
    """A raw HTTP client on one connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def to(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> tuple[bytes, dict[bytes, bytes], bytes]:
        """The next answer: its status line, headers and (de-chunked) body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        status, *lines = head[:-4].split(b"\r\n")
        headers = dict(line.split(b": ", 1) for line in lines)
        if b"content-length" in headers:
            body = await self.reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while size := int(await self.reader.readuntil(b"\r\n"), 16):
                body += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            await self.reader.readexactly(2)
        else:
            body = await asyncio.wait_for(self.reader.read(), 10)
        return status, headers, body

    async def closed(self) -> bool:
        """Whether the server closes the connection (rather than send more)."""
        return await asyncio.wait_for(self.reader.read(), 10) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def get(path: str, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: test", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- requests on one connection -----------------------------------------------------------


async def test_a_kept_alive_connection_serves_one_request_after_another() -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        for n in range(3):
            await client.send(get(f"/n{n}?q={n}"))
            status, headers, body = await client.answer()
            assert status == b"HTTP/1.1 200 OK"
            assert body == f"GET /n{n}?q={n} ".encode()
            assert b"connection" not in headers
        await client.close()
    assert len({scope["client"] for scope in app.seen}) == 1


async def test_pipelined_requests_are_answered_in_their_order() -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        # The first waits for the test; the two after it arrive meanwhile, bodies and all.
        await client.send(
            get("/later")
            + b"POST /second HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
            + get("/third")
        )
        await wait_until(lambda: len(app.seen) == 1)
        app.release.set()
        answers = [(await client.answer())[2] for _ in range(3)]
        await client.close()
    assert answers == [b"GET /later? ", b"POST /second? hello", b"GET /third? "]


async def test_bodies_by_length_and_in_chunks_reach_the_app_whole() -> None:
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nhello")
        await client.send(b" world")
        assert (await client.answer())[2] == b"POST /a? hello world"
        await client.send(
            b"POST /b HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
        )
        await client.send(b"4\r\ndefg\r\n0\r\n\r\n")
        assert (await client.answer())[2] == b"POST /b? abcdefg"
        await client.close()


async def test_a_body_the_app_does_not_read_stops_the_socket_being_read() -> None:
    app = Echo(read_body=False)
    size = 32 * 1024 * 1024
    async with serving(app) as (server, port):
        client = await Client.to(port)
        client.writer.write(b"POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        client.writer.write(b"x" * size)
        await wait_until(lambda: any(c.reading_paused for c in server.connections))
        # Past the high-water mark the server stops reading: the rest waits in the kernel
        # and in the client, not in the server's memory.
        receive = _receive_of(server)
        first = await receive()
        assert HIGH_WATER_BYTES < len(first["body"]) < HIGH_WATER_BYTES + 1024 * 1024
        rest = await read_all(receive)
        assert len(first["body"]) + len(rest) == size
        app.release.set()
        assert (await client.answer())[0] == b"HTTP/1.1 200 OK"
        await client.close()


async def test_the_body_timeout_does_not_run_while_the_server_is_not_reading() -> None:
    """A request that waits before its app reads its body (held for a replica, say) is not
    cut off for the time the server stopped reading it; the time it reads counts."""
    app = Echo()
    limits = ListenerLimits(header_timeout_s=5, body_timeout_s=0.5, max_connections=8)
    size = 4 * HIGH_WATER_BYTES
    async with serving(app, limits=limits) as (server, port):
        client = await Client.to(port)
        await client.send(b"POST /later HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        await client.send(b"z" * size)
        await wait_until(lambda: any(c.reading_paused for c in server.connections))

        answering = asyncio.create_task(client.answer())
        done, _ = await asyncio.wait({answering}, timeout=1.5)  # three body timeouts
        assert not done, f"cut off while the app was not reading: {answering.result()}"

        app.release.set()
        status, _, body = await answering
        assert (status, len(body)) == (b"HTTP/1.1 200 OK", len(b"POST /later? ") + size)
        await client.close()


async def test_a_body_the_server_reads_is_still_timed_after_a_pause() -> None:
    """The pause keeps what was left of the body's time: a client that stops sending once
    the server reads again is cut off then."""
    app = Echo()
    limits = ListenerLimits(header_timeout_s=5, body_timeout_s=0.5, max_connections=8)
    sent = 4 * HIGH_WATER_BYTES
    async with serving(app, limits=limits) as (server, port):
        client = await Client.to(port)
        head = b"POST /later HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (2 * sent)
        await client.send(head + b"z" * sent)  # half the body, then nothing
        await wait_until(lambda: any(c.reading_paused for c in server.connections))
        app.release.set()

        status, _, body = await client.answer()
        assert status == b"HTTP/1.1 408 Request Timeout"
        assert b"did not arrive within 0.5 s" in body
        await client.close()


async def test_a_client_that_leaves_while_its_body_waits_unread_is_seen_to_leave() -> None:
    """Reading is paused, so no read finds the end of the stream: the sweep asks the socket
    instead, and the app hears of it (a request held for a replica gives its place up)."""
    app = Echo(read_body=False)
    size = 3 * HIGH_WATER_BYTES  # more than the server buffers, less than the sockets do
    async with serving(app) as (server, port):
        client = await Client.to(port)
        await client.send(b"POST /notify HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        await client.send(b"n" * size)
        await wait_until(lambda: any(c.reading_paused for c in server.connections))

        await client.close()

        await wait_until(lambda: app.gone == ["/notify"], what="the app told the client left")
        await wait_until(lambda: not server.connections, what="the connection closed")


def _receive_of(server: HttpServer) -> Receive:
    (connection,) = server.connections
    exchange = connection._current
    assert exchange is not None
    return exchange.receive


async def test_a_body_answered_before_it_was_read_is_dropped_and_the_next_request_served() -> None:
    app = Echo(read_body=False)
    async with serving(app) as (_, port):
        client = await Client.to(port)
        size = 4 * HIGH_WATER_BYTES
        await client.send(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        assert (await client.answer())[2] == b"POST /early? "
        await client.send(b"y" * size + get("/next"))
        assert (await client.answer())[2] == b"GET /next? "
        await client.close()


async def test_an_answer_that_closes_while_the_body_still_comes_is_read_then_the_end() -> None:
    """An app that refuses a body mid-way (a chunked body past its limit) answers with
    ``connection: close``: the rest of the body is not read for the request, and the
    client, still sending, gets the whole answer and then the end of the connection, not
    a reset that could take the answer with it."""
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(b"POST /close HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        frame = b"%x\r\n%s\r\n" % (65536, b"y" * 65536)

        async def keep_sending() -> None:
            while True:
                await client.send(frame)

        sending = asyncio.create_task(keep_sending())
        try:
            status, headers, body = await client.answer()
            assert await client.closed()
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sending
            await client.close()
    assert status == b"HTTP/1.1 413 Request Entity Too Large"
    assert headers[b"connection"] == b"close"
    assert body == b"too long"


async def test_a_request_to_upgrade_is_served_as_http_1_1_and_the_connection_closed() -> None:
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(get("/up", "Connection: Upgrade", "Upgrade: h2c"))
        status, headers, body = await client.answer()
        assert (status, body) == (b"HTTP/1.1 200 OK", b"GET /up? ")
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()


async def test_a_streamed_answer_shows_its_head_before_its_first_event() -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(get("/stream"))
        head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 10)
        assert b"transfer-encoding: chunked" in head
        app.release.set()
        events = await asyncio.wait_for(client.reader.readuntil(b"0\r\n\r\n"), 10)
        assert events == b"9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        await client.send(get("/after"))
        assert (await client.answer())[2] == b"GET /after? "
        await client.close()


async def test_a_whole_answer_leaves_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    made = HttpConnection.connection_made

    def counting(self: HttpConnection, transport: Any) -> None:
        made(self, transport)
        write = self.transport.write

        class Counted:
            def __getattr__(self, name: str) -> Any:
                return getattr(transport, name)

            def write(self, data: bytes) -> None:
                writes.append(bytes(data))
                write(data)

        self.transport = Counted()  # type: ignore[assignment]

    monkeypatch.setattr(HttpConnection, "connection_made", counting)
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(get("/one"))
        await client.answer()
        await client.close()
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writes[0].endswith(b"GET /one? ")


# -- the connection's end -----------------------------------------------------------------


async def test_connection_close_and_http_1_0_end_the_connection_after_the_answer() -> None:
    async with serving(Echo()) as (_, port):
        for request in (get("/bye", "Connection: close"), get("/old", version="1.0")):
            client = await Client.to(port)
            await client.send(request)
            status, headers, _ = await client.answer()
            assert status == b"HTTP/1.1 200 OK"
            assert headers[b"connection"] == b"close"
            assert await client.closed()
            await client.close()


async def test_an_http_1_0_client_gets_a_stream_unchunked_ended_by_the_close() -> None:
    app = Echo()
    app.release.set()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(get("/stream", version="1.0"))
        _, headers, body = await client.answer()
        await client.close()
    assert b"transfer-encoding" not in headers
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_expect_100_continue_is_answered_when_the_app_reads() -> None:
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(
            b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"data")
        assert (await client.answer())[2] == b"POST /up? data"
        await client.close()


SMALL_BODIES = ListenerLimits(header_timeout_s=5, body_timeout_s=5, max_body_bytes=1024)


def announcing(path: str, length: int) -> bytes:
    """A request's head announcing a body of ``length`` bytes it holds back for a 100."""
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (
        path.encode(),
        length,
    )


async def test_a_body_announced_over_the_limit_is_413_before_the_app_or_a_100() -> None:
    app = Echo()
    async with serving(app, limits=SMALL_BODIES) as (_, port):
        client = await Client.to(port)
        await client.send(get("/first"))
        assert (await client.answer())[0] == b"HTTP/1.1 200 OK"

        await client.send(announcing("/up", 1025))

        status, headers, body = await client.answer()  # the first thing sent: no 100
        assert status == b"HTTP/1.1 413 Request Entity Too Large"
        assert body == b"The request body exceeds 1024 bytes.\n"
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert [scope["path"] for scope in app.seen] == ["/first"]


async def test_a_body_announced_at_the_limit_is_asked_for_and_read() -> None:
    async with serving(Echo(), limits=SMALL_BODIES) as (_, port):
        client = await Client.to(port)
        await client.send(announcing("/up", 1024))
        interim = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"b" * 1024)
        assert (await client.answer())[2] == b"POST /up? " + b"b" * 1024
        await client.close()


async def test_an_answer_that_never_asked_for_a_held_back_body_closes_the_connection() -> None:
    async with serving(Echo(read_body=False)) as (_, port):
        client = await Client.to(port)
        await client.send(announcing("/refused", 4))

        status, headers, _ = await client.answer()  # the first thing sent: no 100

        assert status == b"HTTP/1.1 200 OK"
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()


async def test_a_body_announced_over_the_limit_behind_an_answer_waits_for_that_answer() -> None:
    """Pipelined behind a request still being answered, a refusal would cut into that
    answer: the answer is given whole, then the connection closes."""
    app = Echo()
    async with serving(app, limits=SMALL_BODIES) as (_, port):
        client = await Client.to(port)
        await client.send(get("/later") + announcing("/up", 1025) + get("/after"))
        await wait_until(lambda: len(app.seen) == 1, what="the first request started")

        app.release.set()

        status, headers, body = await client.answer()
        assert (status, body) == (b"HTTP/1.1 200 OK", b"GET /later? ")
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert [scope["path"] for scope in app.seen] == ["/later"]


@pytest.mark.parametrize(
    "request_bytes",
    [b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n"],
)
async def test_a_request_that_does_not_parse_is_answered_400_and_closed(
    request_bytes: bytes,
) -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(request_bytes)
        status, headers, _ = await client.answer()
        assert status == b"HTTP/1.1 400 Bad Request"
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert app.seen == []


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        pytest.param(
            b"GET /a HTTP/1.1\r\nHost: t\r\nX-Session-Id: \x01\r\n\r\n",
            b"Invalid header value char",
            id="control-in-value",
        ),
        pytest.param(b"GET /a\x01 HTTP/1.1\r\nHost: t\r\n\r\n", b"Invalid char in url", id="url"),
        pytest.param(b"NOT HTTP AT ALL\r\n\r\n", b"Invalid method", id="method"),
    ],
)
async def test_a_request_that_does_not_parse_is_told_what_the_parser_found(
    request_bytes: bytes, reason: bytes
) -> None:
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(request_bytes)
        _, _, body = await client.answer()
        await client.close()
    assert reason in body, body


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
"""A request pipelined after one whose framing is in question: answered only if the server
read the one before it as a proxy in front of it might not have."""


@pytest.mark.parametrize(
    ("head", "status"),
    [
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            id="length-and-chunked",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 4\r\n\r\n0\r\n\r\n",
            400,
            id="chunked-and-length",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            400,
            id="two-equal-lengths",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 9\r\n\r\nabc",
            400,
            id="two-lengths",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity, chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            400,
            id="identity-then-chunked",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            400,
            id="chunked-then-identity",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: xchunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            400,
            id="xchunked",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nabc",
            400,
            id="gzip",
        ),
        pytest.param(
            b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            id="chunked-in-http-1.0",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nX-Fold: a\r\n Transfer-Encoding: chunked\r\n"
            b"Content-Length: 3\r\n\r\nabc",
            400,
            id="obs-folded-transfer-encoding",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length : 3\r\n\r\nabc",
            400,
            id="space-before-colon",
        ),
        pytest.param(b"GET /a HTTP/1.1\nHost: t\n\n", 400, id="bare-line-feeds"),
        pytest.param(b"GET /a HTTP/1.1\r\nHost: t\r\nX\x01Y: z\r\n\r\n", 400, id="control-in-name"),
        pytest.param(
            b"GET /a HTTP/1.1\r\nHost: t\r\nX\xc3\xa9: z\r\n\r\n", 400, id="non-ascii-name"
        ),
        pytest.param(b"GET /a HTTP/1.1\r\n\r\n", 400, id="no-host"),
        pytest.param(b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, id="two-hosts"),
        pytest.param(b"GET /a\r\n\r\n", 505, id="http-0.9"),
        pytest.param(b"GET /a HTTP/2.0\r\nHost: t\r\n\r\n", 505, id="http-2.0"),
        pytest.param(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, id="http-2-preface"),
    ],
)
async def test_a_head_a_proxy_could_frame_otherwise_never_reaches_the_app(
    head: bytes, status: int
) -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(head + SMUGGLED)
        answer_status, headers, _ = await client.answer()
        assert int(answer_status.split()[1]) == status, answer_status
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert app.seen == []


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"0x3\r\nabc\r\n0\r\n\r\n", id="0x"),
        pytest.param(b"-3\r\nabc\r\n0\r\n\r\n", id="negative"),
        pytest.param(b"1" + b"0" * 16 + b"\r\nabc\r\n0\r\n\r\n", id="past-64-bits"),
        pytest.param(b"3\r\nabcdef\r\n0\r\n\r\n", id="longer-than-announced"),
        pytest.param(b"3 \r\nabc\r\n0\r\n\r\n", id="space-after-size"),
        pytest.param(b"3;x\nabc\r\n0\r\n\r\n", id="bare-line-feed"),
    ],
)
async def test_a_chunked_body_that_does_not_parse_is_400_and_nothing_after_it_is_read(
    body: bytes,
) -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + body + SMUGGLED
        )
        status, headers, _ = await client.answer()
        assert status == b"HTTP/1.1 400 Bad Request"
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert [scope["path"] for scope in app.seen] == ["/a"]  # its head was fine; no more


async def test_a_chunked_bodys_trailer_is_not_one_of_the_request_headers() -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\nAuthorization: Bearer trailer\r\nX-Checksum: 1\r\n\r\n"
        )
        status, _, body = await client.answer()
        assert (status, body) == (b"HTTP/1.1 200 OK", b"POST /a? abc")
        await client.close()
    assert app.seen[0]["headers"] == [(b"host", b"t"), (b"transfer-encoding", b"chunked")]


@pytest.mark.parametrize(
    "last",
    [
        pytest.param(get("/a", "Connection: close"), id="connection-close"),
        pytest.param(get("/a", "Connection: keep-alive, close"), id="keep-alive-then-close"),
        pytest.param(get("/a", version="1.0"), id="http-1.0"),
    ],
)
async def test_bytes_after_the_connections_last_request_are_not_read(last: bytes) -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(last + SMUGGLED + b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = await client.answer()
        assert (status, body) == (b"HTTP/1.1 200 OK", b"GET /a? ")
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert [scope["path"] for scope in app.seen] == ["/a"]


async def test_a_head_over_the_limit_is_answered_431() -> None:
    limits = ListenerLimits(max_header_bytes=1024, max_connections=8)
    async with serving(Echo(), limits=limits) as (_, port):
        client = await Client.to(port)
        await client.send(b"GET / HTTP/1.1\r\nX-Padding: " + b"a" * 4096)
        status, _, _ = await client.answer()
        assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
        await client.close()


async def test_a_head_over_the_limit_arriving_in_one_piece_is_answered_431() -> None:
    limits = ListenerLimits(max_header_bytes=1024, max_connections=8)
    app = Echo()
    async with serving(app, limits=limits) as (_, port):
        client = await Client.to(port)
        await client.send(b"GET / HTTP/1.1\r\nX-Padding: " + b"a" * 4096 + b"\r\n\r\n")
        status, headers, _ = await client.answer()
        assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
        assert headers[b"connection"] == b"close"
        await client.close()
    assert app.seen == []


async def test_a_client_that_leaves_is_a_disconnect_to_the_app() -> None:
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(get("/watch"))
        await wait_until(lambda: len(app.seen) == 1)
        await client.close()
        await wait_until(lambda: app.after_body == [{"type": "http.disconnect"}])


async def test_a_client_that_leaves_mid_request_is_told_to_the_app_by_its_callback() -> None:
    # What the gateway cancels its engine request by, without a task watching ``receive``.
    app = Echo()
    async with serving(app) as (_, port):
        client = await Client.to(port)
        await client.send(get("/notify"))
        await wait_until(lambda: len(app.seen) == 1)
        assert app.gone == []
        await client.close()
        await wait_until(lambda: app.gone == ["/notify"])


async def test_a_client_that_leaves_after_its_answer_is_not_a_disconnect_callback() -> None:
    app = Echo()
    app.release.set()
    async with serving(app) as (server, port):
        client = await Client.to(port)
        await client.send(get("/notify"))
        assert (await client.answer())[2] == b"GET /notify? "
        await client.close()
        await wait_until(lambda: not server.connections)
        assert app.gone == []


async def test_a_served_request_leaves_no_reference_cycle_for_the_garbage_collector() -> None:
    # A cycle per request (the scope's extension holding the exchange that holds the scope)
    # costs the collector's pauses at every load; refcounting alone must free a request.
    returned: list[str] = []

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        # Keeps nothing of the request: whatever is left of it after is the server's doing.
        try:
            scope["extensions"][ON_DISCONNECT](lambda: None)
            await read_all(receive)
            headers = [(b"content-length", b"2")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"ok"})
        finally:
            returned.append(scope["path"])

    async with serving(counted, lifespan=False) as (_, port):
        client = await Client.to(port)
        gc.collect()
        gc.disable()
        try:
            for path in ("/notify", "/plain"):
                await client.send(get(path))
                await client.answer()
            await wait_until(lambda: returned == ["/notify", "/plain"])
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, Exchange | ClientGone)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == []
        await client.close()


async def test_a_request_in_flight_when_the_client_leaves_is_not_answered() -> None:
    # The app's own watcher cancels it (the gateway's does); here the request is held and
    # the server must not break on writing to a closed connection.
    app = Echo()
    async with serving(app) as (server, port):
        client = await Client.to(port)
        await client.send(get("/hold"))
        await wait_until(lambda: len(app.seen) == 1)
        await client.close()
        await wait_until(lambda: not server.connections)
        app.release.set()
        other = await Client.to(port)
        await other.send(get("/still"))
        assert (await other.answer())[2] == b"GET /still? "
        await other.close()


async def test_an_idle_kept_alive_connection_is_closed_after_the_idle_time() -> None:
    limits = ListenerLimits(header_timeout_s=0.4, body_timeout_s=0.4, max_connections=8)
    async with serving(Echo(), limits=limits, idle_s=0.5) as (_, port):
        client = await Client.to(port)
        await client.send(get("/first"))
        await client.answer()
        # No answer, no 408: the connection just ends.
        assert await client.closed()
        await client.close()


async def test_a_kept_alive_connection_closed_when_idle_is_counted_apart_from_silent_ones() -> None:
    """A client whose pool keeps a connection longer than the listener does: closed, not
    refused, and counted as such, not with the connections that never sent a byte."""
    limits = ListenerLimits(header_timeout_s=0.4, body_timeout_s=0.4, max_connections=8)
    async with serving(Echo(), limits=limits, idle_s=0.5) as (server, port):
        client = await Client.to(port)
        await client.send(get("/first"))
        await client.answer()
        assert await client.closed()
        await client.close()

        assert server.refusals.keepalive_closed == 1
        assert server.refusals.silent_closed == 0
        assert sum(server.refusals.totals().values()) == 0


EMPTY_LINE_EVERY_S = 0.05
"""The pace of a client sending empty lines: a hundred of them take seconds."""


async def empty_lines_until_closed(client: Client, most: int = 100) -> int:
    """Send empty lines, one at a time, until the server closes the connection or ``most``
    are sent; how many were sent. The server must close it, answering nothing."""
    closed = asyncio.create_task(client.reader.read())
    sent = 0
    try:
        while sent < most and not closed.done():
            try:
                await client.send(b"\r\n")
            except ConnectionError:
                break
            sent += 1
            # The pace of the client under test, cut short by the server closing.
            await asyncio.wait({closed}, timeout=EMPTY_LINE_EVERY_S)
        assert await asyncio.wait_for(closed, 10) == b""
    finally:
        closed.cancel()
    return sent


async def test_empty_lines_do_not_keep_an_idle_connection_open() -> None:
    """Empty lines between requests begin no request (RFC 9112, 2.2): the connection is
    still idle, and closed at the idle time from its last answer however many come."""
    limits = ListenerLimits(header_timeout_s=0.4, body_timeout_s=0.4, max_connections=8)
    async with serving(Echo(), limits=limits, idle_s=0.5) as (server, port):
        client = await Client.to(port)
        await client.send(get("/first"))
        await client.answer()
        sent = await empty_lines_until_closed(client)
        await client.close()

        assert sent < 100
        assert server.refusals.keepalive_closed == 1
        assert sum(server.refusals.totals().values()) == 0


async def test_a_request_after_empty_lines_is_served_on_a_kept_alive_connection() -> None:
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(b"\r\n" + get("/first") + b"\r\n\r\n")
        assert (await client.answer())[2] == b"GET /first? "
        await client.send(b"\r\n" + get("/second"))
        assert (await client.answer())[2] == b"GET /second? "
        await client.close()


async def test_a_connection_whose_body_came_after_its_answer_is_closed_when_idle() -> None:
    """A refusal that needs no body (no key, an unknown path) goes before the body has
    come; the body then comes, and the connection is idle: the idle time holds for it as
    for any other, or a client could keep connections open for ever at no cost."""
    limits = ListenerLimits(header_timeout_s=0.4, body_timeout_s=0.4, max_connections=8)
    async with serving(Echo(read_body=False), limits=limits, idle_s=0.5) as (_, port):
        client = await Client.to(port)
        await client.send(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n")
        assert (await client.answer())[2] == b"POST /early? "
        await client.send(b"hello")
        # No answer, no 408: the connection just ends, as an idle one does.
        assert await client.closed()
        await client.close()


async def test_a_body_that_never_ends_after_its_answer_gets_no_second_answer() -> None:
    """A refusal that needs no body goes before the body; a client that then never sends
    the rest has its connection closed at the body's bound, and is sent nothing more: a
    408 then would be a second answer to a request already answered."""
    limits = ListenerLimits(header_timeout_s=0.4, body_timeout_s=0.4, max_connections=8)
    async with serving(Echo(read_body=False), limits=limits, idle_s=5.0) as (_, port):
        client = await Client.to(port)
        await client.send(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n")
        assert (await client.answer())[2] == b"POST /early? "
        await client.send(b"hel")
        assert await client.closed()
        await client.close()


async def test_a_full_listener_answers_the_next_connection_503() -> None:
    limits = ListenerLimits(max_connections=2)
    async with serving(Echo(), limits=limits) as (_, port):
        held = [await Client.to(port) for _ in range(2)]
        for client in held:  # both served: the server holds them
            await client.send(get("/x"))
            await client.answer()
        refused = await Client.to(port)
        status, _, _ = await refused.answer()
        assert status == b"HTTP/1.1 503 Service Unavailable"
        await held[0].close()
        await refused.close()
        await wait_until(lambda: _serves(port))
        await held[1].close()


async def _serves(port: int) -> bool:
    client = await Client.to(port)
    try:
        await client.send(get("/again"))
        return (await client.answer())[0] == b"HTTP/1.1 200 OK"
    except (ConnectionError, asyncio.IncompleteReadError):
        return False
    finally:
        await client.close()


async def test_a_raising_app_is_a_500() -> None:
    async with serving(Echo()) as (_, port):
        client = await Client.to(port)
        await client.send(get("/fail"))
        status, _headers, body = await client.answer()
        assert status == b"HTTP/1.1 500 Internal Server Error"
        assert body == b"Internal Server Error"
        await client.close()


# -- start and stop -----------------------------------------------------------------------


async def test_a_graceful_shutdown_finishes_requests_in_flight_and_closes_idle_ones() -> None:
    app = Echo()
    async with serving(app) as (server, port):
        idle = await Client.to(port)
        await idle.send(get("/before"))
        await idle.answer()
        busy = await Client.to(port)
        await busy.send(get("/hold"))
        await wait_until(lambda: len(app.seen) == 2)
        server.stop()
        assert await idle.closed()
        with pytest.raises(ConnectionError):
            await Client.to(port)
        app.release.set()
        status, headers, _ = await busy.answer()
        assert status == b"HTTP/1.1 200 OK"
        assert headers[b"connection"] == b"close"
        await idle.close()
        await busy.close()
    assert app.lifespan == ["lifespan.startup", "lifespan.shutdown"]
    assert app.cancelled == 0


async def test_requests_still_in_flight_after_the_grace_are_cancelled() -> None:
    app = Echo()
    async with serving(app, graceful_shutdown_s=0.2) as (server, port):
        client = await Client.to(port)
        await client.send(get("/hold"))
        await wait_until(lambda: len(app.seen) == 1)
        server.stop()
        assert await client.closed()
        await client.close()
    assert app.cancelled == 1


async def test_a_request_cancelled_after_the_grace_may_still_end_its_answer() -> None:
    """A stream cut off by the shutdown can tell its client why, in the stream's own terms
    (the gateway's error event), rather than just stop: its connection closes only after
    the cancelled request has ended its answer."""
    app = Echo()
    async with serving(app, graceful_shutdown_s=0.2) as (server, port):
        client = await Client.to(port)
        await client.send(get("/last-word"))
        await wait_until(lambda: len(app.seen) == 1)
        server.stop()
        status, _, body = await client.answer()
        assert status == b"HTTP/1.1 200 OK"
        assert body == b"data: cut off\n\n"
        assert await client.closed()
        await client.close()
    assert app.cancelled == 1


async def test_an_app_that_fails_its_startup_is_never_served() -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = HttpServer(failing, limits=LIMITS, idle_s=1, graceful_shutdown_s=1)
    with pytest.raises(LifespanFailed, match="no database"):
        await server.start(sock)
    assert sock.fileno() == -1


# -- clients that do not read -------------------------------------------------------------


@dataclass
class Flood:
    """Streams ``size`` bytes in 64 KiB chunks, each sent once the server can take it;
    notes when its client is gone (``gone``)."""

    size: int
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        on_disconnect = scope.get("extensions", {}).get(ON_DISCONNECT)
        if on_disconnect is not None:
            on_disconnect(self.gone.set)
        else:  # uvicorn: told by receive()
            watching = asyncio.create_task(self._watch(receive))
        chunk = b"x" * 65536
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(self.size // len(chunk)):
            if self.gone.is_set():
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        if on_disconnect is None:
            watching.cancel()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()


async def requesting(port: int, *, receive_buffer: int | None = None) -> socket.socket:
    """A client socket that has sent its request and read nothing yet."""
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, get("/flood"))
    return sock


async def test_a_client_that_takes_in_nothing_for_the_send_timeout_is_disconnected() -> None:
    """Its request ends (the app is told its client left), so what it holds is freed."""
    app = Flood(size=1 << 30)
    limits = ListenerLimits(header_timeout_s=5, body_timeout_s=5, send_timeout_s=0.5)
    async with serving(app, limits=limits) as (server, port):
        stalled = await requesting(port, receive_buffer=4096)
        await wait_until(lambda: any(c.write_paused for c in server.connections))

        await asyncio.wait_for(app.gone.wait(), 10)

        await wait_until(lambda: not server.connections)
        stalled.close()


async def test_a_client_that_reads_slowly_but_steadily_gets_all_of_its_answer() -> None:
    """The timeout runs only while the client takes in nothing: one that takes some of it
    more often than that is never cut off, however long the whole answer takes."""
    size = 16 << 20
    app = Flood(size=size)
    limits = ListenerLimits(header_timeout_s=5, body_timeout_s=5, send_timeout_s=1.0)
    async with serving(app, limits=limits) as (server, port):
        sock = await requesting(port)
        loop = asyncio.get_running_loop()
        await wait_until(lambda: any(c.write_paused for c in server.connections))
        received, tail = 0, b""
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            data = await asyncio.wait_for(loop.sock_recv(sock, 64 << 10), 10)
            assert data, f"cut off after {received} bytes"
            received, tail = received + len(data), (tail + data)[-16:]
            await asyncio.sleep(0.02)  # the client's own pace: slow, never stalled
        assert received > size
        assert not app.gone.is_set()
        sock.close()
