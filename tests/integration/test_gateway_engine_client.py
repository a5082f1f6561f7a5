"""The gateway's HTTP/1.1 client for engine requests, against servers written byte by byte.

Real sockets on 127.0.0.1: each test's server answers with exactly the bytes the story
needs (a length, chunks, a body ended by closing, a dropped connection, garbage), so the
client's handling of each is seen on the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.gateway.engine_bounds import MAX_ANSWER_BYTES
from app.gateway.engine_client import EngineClient
from app.gateway.engine_errors import AnswerBroken, AnswerTooLarge, EngineUnreachable
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A TCP server running ``make(server)`` per connection; counts connections and
    requests."""

    def __init__(self, make: Callable[[Server], Handler]) -> None:
        self._handler = make(self)
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self._handler(reader, writer)
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    engines = EngineClient(connect_timeout_s=2)
    yield engines
    engines.close()


def keep_answering(answer: bytes) -> Callable[[Server], Handler]:
    def handler_for(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await server.read_request(reader) is not None:
                writer.write(answer)
                await writer.drain()

        return handler

    return handler_for


async def test_the_request_goes_out_in_one_piece_and_connections_are_reused(
    client: EngineClient,
) -> None:
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    async with Server(keep_answering(answer)) as server:
        for _ in range(3):
            reply = await client.post(server.url, "/v1/completions", b'{"a":1}', "req_1")
            assert (reply.status, reply.content_type, await reply.read()) == (
                200,
                b"application/json",
                b"{}",
            )
            reply.close()
        assert server.connections == 1
        request = server.requests[0]
        assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"\r\nx-request-id: req_1\r\n" in request
        assert request.endswith(b'\r\n\r\n{"a":1}')


async def test_a_chunked_answer_arrives_piece_by_piece(client: EngineClient) -> None:
    release = asyncio.Event()

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b"7\r\ndata: 1\r\n")
            await writer.drain()
            await release.wait()
            writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
            await writer.drain()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/v1/chat/completions", b"{}", "r")
        pieces = reply.chunks()
        assert await anext(pieces) == b"data: 1"
        release.set()
        assert [piece async for piece in pieces] == [b"data: 2"]
        reply.close()


async def test_an_answer_without_a_length_ends_with_the_connection(client: EngineClient) -> None:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
            await writer.drain()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        assert await reply.read() == b"all of it"
        reply.close()


async def test_nothing_listening_is_unreachable(client: EngineClient) -> None:
    async with Server(keep_answering(b"")) as server:
        url = server.url
    with pytest.raises(EngineUnreachable, match="cannot connect"):
        await client.post(url, "/x", b"{}", "r")


async def test_a_connection_dropped_before_the_head_is_unreachable(client: EngineClient) -> None:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)

        return handler

    async with Server(make) as server:
        with pytest.raises(EngineUnreachable):
            await client.post(server.url, "/x", b"{}", "r")


async def test_a_connection_dropped_mid_answer_breaks_it(client: EngineClient) -> None:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
            await writer.drain()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        with pytest.raises(AnswerBroken):
            await reply.read()
        reply.close()


async def test_garbage_breaks_the_answer(client: EngineClient) -> None:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nnope\r\n")
            await writer.drain()
            await reader.read()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        with pytest.raises(AnswerBroken, match="unreadable"):
            await reply.read()
        reply.close()


async def test_a_reused_connection_the_engine_closed_is_replaced(client: EngineClient) -> None:
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # Answer one request, then read the next one and close without answering, as
            # an engine closing an idle connection at the moment a request arrives.
            await server.read_request(reader)
            writer.write(answer)
            await writer.drain()
            if server.connections == 1:
                await server.read_request(reader)
                return
            while await server.read_request(reader) is not None:
                writer.write(answer)
                await writer.drain()

        return handler

    async with Server(make) as server:
        first = await client.post(server.url, "/x", b"{}", "r1")
        assert await first.read() == b"ok"
        second = await client.post(server.url, "/x", b"{}", "r2")
        assert await second.read() == b"ok"
        assert server.connections == 2


async def test_an_abandoned_answer_closes_its_connection(client: EngineClient) -> None:
    closed = asyncio.Event()

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
            await reader.read()  # until the client closes
            closed.set()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        assert await anext(reply.chunks()) == b"abc"
        reply.close()
        await wait_until(closed.is_set, what="the server seeing the connection close")


async def test_a_slow_reader_stops_the_engine_sending(client: EngineClient) -> None:
    size = 32 << 20
    """Far more than the kernel's socket buffers and the client's high-water mark."""
    sent = asyncio.Event()

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
            writer.write(b"x" * size)
            await writer.drain()
            sent.set()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        # Not reading the answer: the client stops at its high-water mark and the server's
        # write cannot finish (without back-pressure it would within milliseconds).
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sent.wait(), timeout=0.5)
        assert len(await reply.read()) == size
        await wait_until(sent.is_set, what="the server's write finishing")
        reply.close()


async def test_engines_no_longer_routed_lose_their_pools_once_their_answers_are_done(
    client: EngineClient,
) -> None:
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    release = asyncio.Event()
    closed: dict[str, asyncio.Event] = {}

    def make(name: str, *, hold_first: bool) -> Callable[[Server], Handler]:
        closed[name] = asyncio.Event()

        def handler_for(server: Server) -> Handler:
            async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                while await server.read_request(reader) is not None:
                    if hold_first and len(server.requests) == 1:
                        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                        writer.write(b"3\r\none\r\n")
                        await writer.drain()
                        await release.wait()
                        writer.write(b"3\r\ntwo\r\n0\r\n\r\n")
                    else:
                        writer.write(answer)
                    await writer.drain()
                closed[name].set()  # the client closed the connection

            return handler

        return handler_for

    async with (
        Server(make("kept", hold_first=False)) as kept,
        Server(make("idle", hold_first=False)) as idle,
        Server(make("busy", hold_first=True)) as busy,
    ):
        for server in (kept, idle):
            reply = await client.post(server.url, "/x", b"{}", "r")
            assert await reply.read() == b"ok"
        streaming = await client.post(busy.url, "/x", b"{}", "r")
        pieces = streaming.chunks()
        assert await anext(pieces) == b"one"

        client.keep_only({kept.url})

        assert client.pooled == {kept.url}
        await wait_until(closed["idle"].is_set, what="the idle connection closing")
        assert not closed["busy"].is_set()  # the answer in progress goes on
        release.set()
        assert [piece async for piece in pieces] == [b"two"]
        streaming.close()
        await wait_until(closed["busy"].is_set, what="the busy connection closing when done")
        again = await client.post(kept.url, "/x", b"{}", "r")
        assert await again.read() == b"ok"
        assert (kept.connections, closed["kept"].is_set()) == (1, False)


async def test_a_sweep_among_engines_left_closes_those_and_pools_opened_since_the_last(
    client: EngineClient,
) -> None:
    """A gateway looks only at the engines a snapshot stopped routing to, and at the pools
    opened since the last snapshot: a request that chose an engine just before it left
    routing may open its pool after that snapshot was taken in."""
    async with (
        Server(keep_answering(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")) as kept,
        Server(keep_answering(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")) as late,
    ):
        for server in (kept, late):
            assert await (await client.post(server.url, "/x", b"{}", "r")).read() == b"ok"

        client.keep_only({kept.url}, among=[])

        assert client.pooled == {kept.url}  # opened since the last sweep, and not routed
        assert await (await client.post(late.url, "/x", b"{}", "r")).read() == b"ok"
        client.keep_only({kept.url, late.url}, among=[])
        client.keep_only({kept.url, late.url}, among=[])
        assert client.pooled == {kept.url, late.url}

        client.keep_only({kept.url}, among=[late.url])

        assert client.pooled == {kept.url}


# -- an engine's answer is hostile input too ------------------------------------------------


def send_then_wait(
    *pieces: bytes, closed: asyncio.Event | None = None
) -> Callable[[Server], Handler]:
    """Answer the first request with ``pieces``, written one by one, then hold the connection
    until the client closes it (``closed`` is set then)."""

    def handler_for(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            try:
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                await reader.read()
            except ConnectionError:
                pass
            if closed is not None:
                closed.set()

        return handler

    return handler_for


@pytest.mark.parametrize(
    "filler",
    [
        pytest.param(b"x-endless: " + b"a" * (1 << 20), id="one-endless-header"),
        pytest.param(b"x-many: header\r\n" * (1 << 16), id="header-after-header"),
        pytest.param(b"\r\n".join([b"HTTP/1.1 100 Continue\r\n"] * (1 << 16)), id="interim-heads"),
    ],
)
async def test_an_answer_head_without_end_is_refused_at_64_kib(
    client: EngineClient, filler: bytes
) -> None:
    # A megabyte of head and more, and the connection held open: before the bound, the
    # client read on (and httptools joined an endless header's pieces over and over, a
    # CPU-bound loop) until the engine stopped, waiting for a head that never ends.
    closed = asyncio.Event()
    first = b"" if filler.startswith(b"HTTP/") else b"HTTP/1.1 200 OK\r\n"
    async with Server(send_then_wait(first, filler, filler, closed=closed)) as server:
        async with asyncio.timeout(10):
            with pytest.raises(EngineUnreachable, match="over 64 KiB"):
                await client.post(server.url, "/x", b"{}", "r")
            await closed.wait()  # the connection is dropped, not kept for another request


@pytest.mark.parametrize("apart", [False, True], ids=["in-one-write", "apart"])
async def test_interim_answers_are_skipped(client: EngineClient, apart: bool) -> None:
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n"
        b"content-type: text/html\r\n\r\n",
    )
    final = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    pieces = (*interim, final) if apart else (b"".join((*interim, final)),)

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await server.read_request(reader) is not None:
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)

        return handler

    async with Server(make) as server:
        for _ in range(2):
            reply = await client.post(server.url, "/x", b"{}", "r")
            assert (reply.status, reply.content_type, await reply.read()) == (
                200,
                b"application/json",
                b"{}",
            )
            reply.close()
        assert server.connections == 1  # the connection was fit for the next request


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade",
        b"HTTP/1.1 000 Nothing",
        b"HTTP/1.1 099 Below",
        b"HTTP/1.1 600 Above",
        b"HTTP/1.1 999 Odd",
    ],
    ids=["101", "000", "099", "600", "999"],
)
async def test_a_status_the_gateway_does_not_relay_is_refused(
    client: EngineClient, status_line: bytes
) -> None:
    closed = asyncio.Event()
    answer = status_line + b"\r\ncontent-length: 2\r\n\r\nok"
    async with Server(send_then_wait(answer, closed=closed)) as server:
        status = status_line.split()[1].decode()
        with pytest.raises(EngineUnreachable, match=f"status {status}"):
            await client.post(server.url, "/x", b"{}", "r")
        await asyncio.wait_for(closed.wait(), timeout=5)


async def test_a_declared_length_over_the_bound_is_refused_before_reading(
    client: EngineClient,
) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (MAX_ANSWER_BYTES + 1)
    closed = asyncio.Event()
    async with Server(send_then_wait(head, b"x" * 1024, closed=closed)) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        async with asyncio.timeout(5):
            with pytest.raises(AnswerTooLarge, match="over 256 MiB"):
                await reply.read()
            reply.close()
            await closed.wait()


async def test_a_chunked_answer_past_the_bound_is_refused(client: EngineClient) -> None:
    piece = b"x" * (1 << 20)
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    closed = asyncio.Event()
    sent = 0

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal sent
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            try:
                # The bound and a megabyte more, then a proper end: without the bound the
                # client reads it all into memory, and would read on for as long as the
                # engine went on.
                while sent <= MAX_ANSWER_BYTES:
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(piece)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                await reader.read()
            except ConnectionError:
                pass
            closed.set()

        return handler

    async with Server(make) as server:
        reply = await client.post(server.url, "/x", b"{}", "r")
        with pytest.raises(AnswerTooLarge, match="over 256 MiB"):
            await reply.read()
        reply.close()
        await asyncio.wait_for(closed.wait(), timeout=10)
        assert sent <= MAX_ANSWER_BYTES + 8 * len(piece)  # it stopped reading near the bound
