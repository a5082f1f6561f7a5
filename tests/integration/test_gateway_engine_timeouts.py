"""How long the engine client waits on an engine, against servers that go silent on purpose.

Real sockets on 127.0.0.1, bounds of a fraction of a second: an engine that takes the
request and never answers, one that sends its answer's head and nothing more, one that
sends a piece and goes silent. Each ends with the engine's connection closed (how the
engine learns to abort) and the bound told once; an engine that keeps talking, or a
reader that is slow, is never cut off however long the answer takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.gateway.engine_bounds import MAX_ERROR_BYTES, EngineTimeouts
from app.gateway.engine_client import EngineClient
from app.gateway.engine_errors import AnswerStalled, AnswerTooLarge, HeadTimedOut

pytestmark = pytest.mark.timeout(30)

HEAD_S = 0.3
IDLE_S = 0.2
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Engine:
    """A TCP server that reads one request per connection, then runs ``script``; ``closed``
    is set once the client closed the connection after it."""

    def __init__(self, script: Script) -> None:
        self._script = script
        self.closed = asyncio.Event()
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Engine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            self.requests += 1
            await self._script(reader, writer)
            await reader.read()  # until the client closes
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.closed.set()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def send(*pieces: bytes) -> Script:
    """Send ``pieces``, then say nothing more."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()

    return script


@pytest.fixture
def told() -> list[str]:
    return []


@pytest.fixture
async def client(told: list[str]) -> AsyncIterator[EngineClient]:
    engines = EngineClient(
        connect_timeout_s=2,
        timeouts=EngineTimeouts(head_s=HEAD_S, idle_s=IDLE_S),
        on_timeout=told.append,
    )
    yield engines
    engines.close()


async def test_an_engine_that_never_answers_times_out_and_its_connection_is_closed(
    client: EngineClient, told: list[str]
) -> None:
    # Before the bound the request waited for as long as the engine kept its connection.
    async with Engine(send()) as engine:
        with pytest.raises(HeadTimedOut, match=f"did not answer within {HEAD_S:g} s"):
            await client.post(engine.url, "/v1/completions", b"{}", "r")
        await asyncio.wait_for(engine.closed.wait(), timeout=5)
    assert told == ["head"]
    assert engine.requests == 1  # not sent again: the engine had it


async def test_a_head_and_then_silence_stalls_the_first_piece_within_the_head_bound(
    client: EngineClient, told: list[str]
) -> None:
    # An engine that queues a streamed request sends its head at once and its first piece
    # only once it is generated: that wait is the head bound's, not the idle bound's.
    async with Engine(send(STREAM_HEAD + b"\r\n\r\n")) as engine:
        answer = await client.post(engine.url, "/v1/completions", b"{}", "r")
        with pytest.raises(AnswerStalled, match=f"body within {HEAD_S:g} s") as stalled:
            await anext(answer.chunks())
        assert stalled.value.bound == "head"
        answer.close()
        await asyncio.wait_for(engine.closed.wait(), timeout=5)
    assert told == ["head"]


async def test_a_stream_that_goes_silent_mid_answer_stalls_after_the_idle_bound(
    client: EngineClient, told: list[str]
) -> None:
    script = send(STREAM_HEAD + b"\r\n\r\n" + chunk(b"data: {}\n\n"))
    async with Engine(script) as engine:
        answer = await client.post(engine.url, "/v1/completions", b"{}", "r")
        pieces = answer.chunks()
        assert await anext(pieces) == b"data: {}\n\n"
        with pytest.raises(AnswerStalled, match=f"sent nothing for {IDLE_S:g} s") as stalled:
            await anext(pieces)
        assert (stalled.value.bound, stalled.value.timeout_s) == ("idle", IDLE_S)
        answer.close()
        await asyncio.wait_for(engine.closed.wait(), timeout=5)
    assert told == ["idle"]


async def test_the_idle_bound_holds_from_the_first_piece_when_the_head_bound_is_longer(
    told: list[str],
) -> None:
    # The head bound is far longer (as by default: 600 s against 120 s): a stream that goes
    # silent after its first piece is cut off after the idle bound, not the head bound.
    long_head_s = 20.0
    engines = EngineClient(
        timeouts=EngineTimeouts(head_s=long_head_s, idle_s=IDLE_S), on_timeout=told.append
    )
    script = send(STREAM_HEAD + b"\r\n\r\n" + chunk(b"data: {}\n\n"))
    async with Engine(script) as engine:
        answer = await engines.post(engine.url, "/v1/completions", b"{}", "r")
        pieces = answer.chunks()
        assert await anext(pieces) == b"data: {}\n\n"
        async with asyncio.timeout(long_head_s / 2):
            with pytest.raises(AnswerStalled, match=f"sent nothing for {IDLE_S:g} s"):
                await anext(pieces)
    engines.close()
    assert told == ["idle"]


async def test_a_whole_answer_whose_body_stops_coming_stalls(
    client: EngineClient, told: list[str]
) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"
    async with Engine(send(head, b"only part")) as engine:
        answer = await client.post(engine.url, "/v1/embeddings", b"{}", "r")
        with pytest.raises(AnswerStalled, match="sent nothing for"):
            await answer.read()
        await asyncio.wait_for(engine.closed.wait(), timeout=5)
    assert told == ["idle"]


async def test_an_engine_that_keeps_talking_is_never_cut_off(
    client: EngineClient, told: list[str]
) -> None:
    # Pieces come far more often than the idle bound, for longer than both bounds in all:
    # the silence is bounded, not the answer.
    pieces = 12

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + b"\r\n\r\n")
        for n in range(pieces):
            await asyncio.sleep(IDLE_S / 4)
            writer.write(chunk(b"%d" % n))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async with Engine(script) as engine:
        answer = await client.post(engine.url, "/v1/completions", b"{}", "r")
        got = [piece async for piece in answer.chunks()]
        answer.close()
    assert got == [b"%d" % n for n in range(pieces)]
    assert told == []


async def test_a_reader_that_stops_reading_is_not_the_engines_silence(
    client: EngineClient, told: list[str]
) -> None:
    size = 32 << 20
    """Far more than the kernel's buffers and the client's high-water mark: the client
    stops reading from the engine, which can send nothing more meanwhile."""
    sent = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()
        sent.set()

    async with Engine(script) as engine:
        answer = await client.post(engine.url, "/v1/embeddings", b"{}", "r")
        # Not read for several idle bounds: the engine is held back, not silent.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sent.wait(), timeout=IDLE_S * 4)
        assert len(await answer.read()) == size
        answer.close()
    assert told == []


async def test_a_kept_alive_connection_carries_no_clock_between_answers(
    client: EngineClient, told: list[str]
) -> None:
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(ok)
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(ok)

    async with Engine(script) as engine:
        first = await client.post(engine.url, "/x", b"{}", "r1")
        assert await first.read() == b"ok"
        # Idle in the pool past both bounds (within its keep-alive), then used again.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(engine.closed.wait(), timeout=HEAD_S * 2)
        second = await client.post(engine.url, "/x", b"{}", "r2")
        assert await second.read() == b"ok"
        assert engine.requests == 1  # one connection carried both
    assert told == []


async def test_an_error_answer_over_1_mib_is_refused_before_reading(
    client: EngineClient,
) -> None:
    # Before, an error body was read up to the 256 MiB of a good answer.
    head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n" % (
        MAX_ERROR_BYTES + 1
    )
    async with Engine(send(head, b"x" * 1024)) as engine:
        answer = await client.post(engine.url, "/x", b"{}", "r")
        with pytest.raises(AnswerTooLarge, match=r"error answer \(HTTP 500\) is over 1 MiB"):
            await answer.read()
        await asyncio.wait_for(engine.closed.wait(), timeout=5)


async def test_a_chunked_error_answer_is_refused_past_1_mib(client: EngineClient) -> None:
    piece = chunk(b"e" * (64 << 10))
    head = b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n"
    async with Engine(send(head, piece * 17)) as engine:
        answer = await client.post(engine.url, "/x", b"{}", "r")
        with pytest.raises(AnswerTooLarge, match="goes on past it"):
            await answer.read()
        await asyncio.wait_for(engine.closed.wait(), timeout=5)


async def test_an_upload_is_given_the_head_bound_once_its_body_is_sent(
    client: EngineClient, told: list[str]
) -> None:
    # The body arrives at its sender's pace, here over twice the head bound; the engine's
    # time to answer starts once it has all of it.
    async def slow_body() -> AsyncIterator[bytes]:
        for _ in range(4):
            await asyncio.sleep(HEAD_S / 2)
            yield b"x" * 10

    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    async with Engine(send(ok)) as engine:
        answer = await client.upload(engine.url, "/x", b"a/b", 40, slow_body(), "r")
        assert (answer.status, await answer.read()) == (200, b"ok")
    assert told == []

    async def body() -> AsyncIterator[bytes]:
        yield b"x" * 40

    async with Engine(send()) as engine:
        with pytest.raises(HeadTimedOut):
            await client.upload(engine.url, "/x", b"a/b", 40, body(), "r")
        await asyncio.wait_for(engine.closed.wait(), timeout=5)
    assert told == ["head"]


async def test_an_engine_that_stops_reading_an_upload_times_out_within_the_idle_bound(
    told: list[str],
) -> None:
    # The engine takes the connection and reads nothing: once the kernel's buffers are
    # full the upload waits on the engine, which is the engine's silence, not the sender's.
    stalled = asyncio.Event()
    accepted: list[asyncio.StreamWriter] = []

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await stalled.wait()

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"x" * (1 << 20)

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    engines = EngineClient(
        connect_timeout_s=2,
        timeouts=EngineTimeouts(head_s=60, idle_s=IDLE_S),
        on_timeout=told.append,
    )
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        with pytest.raises(HeadTimedOut, match="did not read the request"):
            await client_upload(engines, url, endless())
    finally:
        stalled.set()
        engines.close()
        server.close()
    assert told == ["idle"]


async def client_upload(engines: EngineClient, url: str, body: AsyncIterator[bytes]) -> None:
    await engines.upload(url, "/x", b"a/b", None, body, "r")  # type: ignore[arg-type]
