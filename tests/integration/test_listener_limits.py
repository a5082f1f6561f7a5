"""Slow and greedy clients at both HTTP listeners, over real sockets: the gateway's client
listener (llmgw's own HTTP server, in its own thread) and the admin API's (uvicorn on this
test's loop).

A slowloris client sends its headers, or its body, one byte at a time; it is answered 408
and cut off when its time is up, while ordinary clients are served the whole time. One
that waits before its first head, silent or sending empty lines, has only what is left of
the header timeout since it connected. A listener holding as many connections as it may
answers the next one 503 at once, and serves again once one goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.admin.bodies import MAX_BODY_BYTES as ADMIN_MAX_BODY_BYTES
from app.gateway.request_body import MAX_BODY_BYTES
from app.gateway.server import StaticSource
from app.listeners.limits import ListenerLimits, limited
from app.store.postgres import PostgresEventStore
from tests.integration.test_http_server import Client, Echo, Flood, get, requesting
from tests.support.admin_server import serving_admin
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

HEAD = b"GET /healthz HTTP/1.1\r\nHost: llmgw\r\nUser-Agent: slowloris\r\nAccept: */*\r\n\r\n"
BYTE_EVERY_S = 0.05
"""The slow client's pace: the head above would take seconds to arrive."""
QUICK = ListenerLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=64)


@dataclass
class Trickled:
    sent: int
    """Bytes the client got out before the server hung up."""
    answer: bytes
    ended_at: float


async def trickle(
    port: int, data: bytes, *, quickly: bytes = b"", after_s: float = 0.0
) -> Trickled:
    """Connect, say nothing for ``after_s``, send ``quickly`` at once and then ``data`` a byte
    at a time until the server answers or all is sent; the server's answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answered = asyncio.create_task(reader.read())
    sent = 0
    try:
        await asyncio.wait({answered}, timeout=after_s)
        writer.write(quickly)
        await writer.drain()
        for byte in data:
            if answered.done():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            sent += 1
            # The pace of the client under test, cut short by the server's answer.
            await asyncio.wait({answered}, timeout=BYTE_EVERY_S)
        answer = await asyncio.wait_for(answered, 10)
    finally:
        answered.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return Trickled(sent=sent, answer=answer, ended_at=time.monotonic())


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.fixture
def gateway() -> Iterator[GatewayThread]:
    _, record = new_key()
    with GatewayThread(StaticSource(snapshot_of([], [record])), limits=QUICK) as gateway:
        yield gateway


ADMIN_TOKEN = secrets.token_hex(16)


@asynccontextmanager
async def admin_listener(store: PostgresEventStore, limits: ListenerLimits) -> AsyncIterator[int]:
    async with serving_admin(store, tokens={ADMIN_TOKEN: "alice"}, limits=limits) as url:
        yield int(url.rsplit(":", 1)[1])


# -- slow headers, slow bodies ------------------------------------------------------------


async def served_meanwhile(base_url: str, count: int = 5) -> float:
    """``count`` ordinary requests, each answered 200; when the last was answered."""
    async with httpx.AsyncClient(base_url=base_url) as client:
        for _ in range(count):
            answer = await client.get("/healthz")
            assert answer.status_code == 200
    return time.monotonic()


async def test_the_gateway_cuts_off_clients_sending_headers_a_byte_at_a_time(
    gateway: GatewayThread,
) -> None:
    slow = [asyncio.create_task(trickle(gateway.gateway.port, HEAD)) for _ in range(10)]

    served_at = await served_meanwhile(gateway.base_url)
    cut = await asyncio.gather(*slow)

    for client in cut:
        assert client.sent < len(HEAD)
        assert status_of(client.answer) == 408
        assert b'"type":"invalid_request_error"' in client.answer
        assert b"The request's headers did not arrive within 1 s." in client.answer
        assert served_at < client.ended_at


LATE_BY_S = 0.7
"""How long the late client below waits (silent, or sending empty lines) before its head:
most of ``QUICK``'s header timeout."""
EMPTY_LINES_FOR_S = b"\r\n" * round(LATE_BY_S / BYTE_EVERY_S / 2)
"""Empty lines that take the late client ``LATE_BY_S`` to send, a byte at a time."""
LATE_HEAD_BYTES_AT_MOST = round(0.75 * QUICK.header_timeout_s / BYTE_EVERY_S)
"""What of its head the late client gets out before it is cut off: its head is due at the
header timeout from its connecting, 0.3 s after it began it (a quarter of the timeout more
at most, the sweep's period), so the client sends for about 0.55 s at most; timed from its
first byte, it would send for a whole header timeout, and more."""


@pytest.mark.parametrize("before", [b"", EMPTY_LINES_FOR_S], ids=["silent", "empty-lines"])
async def test_the_gateway_times_a_late_first_head_from_the_connection_opening(
    gateway: GatewayThread, before: bytes
) -> None:
    late_by_s = 0.0 if before else LATE_BY_S
    client = await trickle(gateway.gateway.port, before + HEAD, after_s=late_by_s)

    assert status_of(client.answer) == 408
    assert b"The request's headers did not arrive within 1 s." in client.answer
    assert len(before) < client.sent <= len(before) + LATE_HEAD_BYTES_AT_MOST


async def test_the_gateway_cuts_off_a_client_sending_its_body_a_byte_at_a_time(
    gateway: GatewayThread,
) -> None:
    key, record = new_key()
    gateway.publish(snapshot_of([], [record], frozenset({"m"})))
    body = b'{"model": "m", "prompt": "' + b"x" * 200 + b'"}'
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: llmgw\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (key.encode(), len(body))
    )

    client = await trickle(gateway.gateway.port, body, quickly=head)

    assert client.sent < len(body)
    assert status_of(client.answer) == 408
    assert b"The request's body did not arrive within 1 s." in client.answer


async def test_the_gateway_refuses_headers_over_the_limit(gateway: GatewayThread) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.gateway.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: llmgw\r\nX-Padding: " + b"a" * 100_000)
    await writer.drain()

    answer = await asyncio.wait_for(reader.read(), 10)

    assert status_of(answer) == 431
    writer.close()


async def test_the_admin_api_cuts_off_clients_sending_headers_a_byte_at_a_time(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, QUICK) as port:
        slow = [asyncio.create_task(trickle(port, HEAD)) for _ in range(10)]

        served_at = await served_meanwhile(f"http://127.0.0.1:{port}")
        cut = await asyncio.gather(*slow)

    for client in cut:
        assert client.sent < len(HEAD)
        assert status_of(client.answer) == 408
        assert b"content-type: application/problem+json" in client.answer
        assert b"The request's headers did not arrive within 1 s." in client.answer
        assert served_at < client.ended_at


@pytest.mark.parametrize("before", [b"", EMPTY_LINES_FOR_S], ids=["silent", "empty-lines"])
async def test_the_admin_api_times_a_late_first_head_from_the_connection_opening(
    pg_store: PostgresEventStore, before: bytes
) -> None:
    late_by_s = 0.0 if before else LATE_BY_S
    async with admin_listener(pg_store, QUICK) as port:
        client = await trickle(port, before + HEAD, after_s=late_by_s)

    assert status_of(client.answer) == 408
    assert b"The request's headers did not arrive within 1 s." in client.answer
    assert len(before) < client.sent <= len(before) + LATE_HEAD_BYTES_AT_MOST


async def test_the_admin_api_cuts_off_a_client_sending_its_body_a_byte_at_a_time(
    pg_store: PostgresEventStore,
) -> None:
    body = b'{"reason": "' + b"r" * 200 + b'"}'
    head = (
        b"POST /admin/v1/nodes/gpu-1/cordon HTTP/1.1\r\nHost: llmgw\r\n"
        b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (ADMIN_TOKEN.encode(), len(body))
    )
    async with admin_listener(pg_store, QUICK) as port:
        client = await trickle(port, body, quickly=head)

    assert client.sent < len(body)
    assert status_of(client.answer) == 408
    assert b"The request's body did not arrive within 1 s." in client.answer


# -- a cap on connections -----------------------------------------------------------------

CAPPED = ListenerLimits(header_timeout_s=30.0, body_timeout_s=30.0, max_connections=4)


async def connections_are_capped(port: int, base_url: str) -> None:
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    try:
        one_more_reader, one_more_writer = await asyncio.open_connection("127.0.0.1", port)
        one_more_writer.write(HEAD)
        answer = await asyncio.wait_for(one_more_reader.read(), 10)
        assert status_of(answer) == 503
        one_more_writer.close()

        _, first_writer = idle.pop()
        first_writer.close()

        async def served() -> bool:
            async with httpx.AsyncClient(base_url=base_url) as client:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.HTTPError:
                    return False

        await wait_until(served, what="a request served once a connection went")
    finally:
        for _, writer in idle:
            writer.close()


async def test_the_gateway_answers_a_connection_over_its_cap_503_at_once() -> None:
    _, record = new_key()
    with GatewayThread(StaticSource(snapshot_of([], [record])), limits=CAPPED) as gateway:
        await connections_are_capped(gateway.gateway.port, gateway.base_url)


async def test_the_admin_api_answers_a_connection_over_its_cap_503_at_once(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, CAPPED) as port:
        await connections_are_capped(port, f"http://127.0.0.1:{port}")


# -- a body announced over the limit, with Expect: 100-continue ---------------------------

PATIENT = ListenerLimits(header_timeout_s=30.0, body_timeout_s=30.0, max_connections=64)
"""Timeouts far past ``AT_ONCE_S``: an answer within it is not a timeout's."""
AT_ONCE_S = 5.0
SMALL_UPLOAD = 64 * 1024


@dataclass
class Announced:
    answer: bytes
    """What the server sent within ``AT_ONCE_S``."""
    closed: bool
    """Whether it closed the connection within ``AT_ONCE_S``."""


async def announce(port: int, head: bytes) -> Announced:
    """Send a request's ``head``, which announces a body and ``Expect: 100-continue``, and
    never the body; what the server sends, and whether it closes the connection, within
    ``AT_ONCE_S``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = b""
    closed = False
    try:
        writer.write(head)
        await writer.drain()
        async with asyncio.timeout(AT_ONCE_S):
            while not closed:
                data = await reader.read(65536)
                answer += data
                closed = not data
    except TimeoutError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return Announced(answer, closed)


def announcing(target: str, length: int, *headers: str) -> bytes:
    lines = [
        f"POST {target} HTTP/1.1",
        "Host: llmgw",
        *headers,
        f"Content-Length: {length}",
        "Expect: 100-continue",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def refused_at_once(announced: Announced) -> bytes:
    """The 413's body, once checked that nothing else came (no 100 Continue first) and
    that the connection was closed after it."""
    assert announced.answer.startswith(b"HTTP/1.1 413 "), announced
    assert announced.closed, announced
    return announced.answer.partition(b"\r\n\r\n")[2]


@pytest.fixture
def patient_gateway() -> Iterator[tuple[str, GatewayThread]]:
    key, record = new_key()
    source = StaticSource(snapshot_of([], [record], frozenset({"m"})))
    with GatewayThread(source, limits=PATIENT, max_upload_bytes=SMALL_UPLOAD) as gateway:
        yield key, gateway


@pytest.mark.parametrize(
    ("target", "length", "content_type"),
    [
        ("/v1/chat/completions", MAX_BODY_BYTES + 1, "application/json"),
        ("/v1/embeddings", MAX_BODY_BYTES + 1, "application/json"),
        ("/v1/audio/transcriptions", SMALL_UPLOAD + 1, "multipart/form-data; boundary=b"),
    ],
    ids=["chat", "embeddings", "upload"],
)
async def test_the_gateway_refuses_a_body_announced_over_its_limit_413_without_reading_it(
    patient_gateway: tuple[str, GatewayThread], target: str, length: int, content_type: str
) -> None:
    key, gateway = patient_gateway
    head = announcing(
        target, length, f"Authorization: Bearer {key}", f"Content-Type: {content_type}"
    )

    announced = await announce(gateway.gateway.port, head)

    body = refused_at_once(announced)
    assert b'"type":"invalid_request_error"' in body
    assert b"exceeds" in body


async def test_the_gateway_refuses_a_body_over_anything_it_takes_before_asking_for_a_key(
    patient_gateway: tuple[str, GatewayThread],
) -> None:
    _, gateway = patient_gateway
    head = announcing("/v1/chat/completions", 10 * 1024**3, "Content-Type: application/json")

    body = refused_at_once(await announce(gateway.gateway.port, head))

    assert b'"type":"invalid_request_error"' in body


async def test_the_admin_api_refuses_a_body_announced_over_its_limit_413_without_reading_it(
    pg_store: PostgresEventStore,
) -> None:
    async with admin_listener(pg_store, PATIENT) as port:
        for headers in ([f"Authorization: Bearer {ADMIN_TOKEN}"], []):
            head = announcing(
                "/admin/v1/nodes/gpu-1/cordon",
                ADMIN_MAX_BODY_BYTES + 1,
                *headers,
                "Content-Type: application/json",
            )

            body = refused_at_once(await announce(port, head))

            assert b'"status":413' in body


@asynccontextmanager
async def uvicorn_serving(app: Echo | Flood, limits: ListenerLimits) -> AsyncIterator[int]:
    """uvicorn with ``limits`` (``app.listeners.limits``) serving ``app``; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", http=limited(HttpToolsProtocol, limits)
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await wait_until(lambda: server.started, within_s=10, what="listening")
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        await serving


SMALL_BODIES = ListenerLimits(header_timeout_s=30, body_timeout_s=30, max_body_bytes=1024)


async def test_uvicorn_refuses_the_next_request_on_a_connection_announcing_too_much() -> None:
    app = Echo()
    async with uvicorn_serving(app, SMALL_BODIES) as port:
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


async def test_uvicorn_finishes_an_answer_before_closing_for_a_pipelined_refusal() -> None:
    app = Echo()
    async with uvicorn_serving(app, SMALL_BODIES) as port:
        client = await Client.to(port)
        await client.send(get("/later") + announcing("/up", 1025) + get("/after"))
        await wait_until(lambda: len(app.seen) == 1, what="the first request started")

        app.release.set()

        status, _, body = await client.answer()
        assert (status, body) == (b"HTTP/1.1 200 OK", b"GET /later? ")
        assert await client.closed()
        await client.close()
    assert [scope["path"] for scope in app.seen] == ["/later"]


async def test_uvicorn_refuses_a_head_over_the_limit_arriving_in_one_piece() -> None:
    app = Echo()
    limits = ListenerLimits(header_timeout_s=30, body_timeout_s=30, max_header_bytes=1024)
    async with uvicorn_serving(app, limits) as port:
        client = await Client.to(port)
        await client.send(
            b"GET /big HTTP/1.1\r\nHost: llmgw\r\nX-Padding: " + b"a" * 4096 + b"\r\n\r\n"
        )

        status, headers, _ = await client.answer()
        assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert app.seen == []


@pytest.mark.parametrize(
    ("head", "status"),
    [
        pytest.param(b"GET /a HTTP/1.1\r\n\r\n", 400, id="no-host"),
        pytest.param(b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, id="two-hosts"),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity, chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            400,
            id="identity-then-chunked",
        ),
        pytest.param(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: xchunked\r\n\r\nabc",
            400,
            id="xchunked",
        ),
        pytest.param(b"GET /a\r\n\r\n", 505, id="http-0.9"),
    ],
)
async def test_uvicorn_refuses_a_head_a_proxy_could_frame_otherwise(
    head: bytes, status: int
) -> None:
    app = Echo()
    async with uvicorn_serving(app, SMALL_BODIES) as port:
        client = await Client.to(port)
        await client.send(head + get("/smuggled"))

        answer_status, headers, _ = await client.answer()
        assert int(answer_status.split()[1]) == status, answer_status
        assert headers[b"connection"] == b"close"
        assert await client.closed()
        await client.close()
    assert app.seen == []


async def test_uvicorn_with_the_limits_leaves_a_trailer_out_of_the_request_headers() -> None:
    app = Echo()
    async with uvicorn_serving(app, SMALL_BODIES) as port:
        client = await Client.to(port)
        await client.send(
            b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\nAuthorization: Bearer trailer\r\n\r\n"
        )

        status, _, body = await client.answer()
        assert (status, body) == (b"HTTP/1.1 200 OK", b"POST /a? abc")
        await client.close()
    assert app.seen[0]["headers"] == [(b"host", b"t"), (b"transfer-encoding", b"chunked")]


# -- clients that take in nothing -------------------------------------------------------


async def test_uvicorn_with_the_limits_disconnects_a_client_that_takes_in_nothing() -> None:
    """The admin API's server: a client that reads nothing of a large answer for the send
    timeout is dropped, and the app is told it left."""
    app = Flood(size=1 << 30)
    limits = ListenerLimits(header_timeout_s=5, body_timeout_s=5, send_timeout_s=0.5)
    async with uvicorn_serving(app, limits) as port:
        stalled = await requesting(port, receive_buffer=4096)

        await asyncio.wait_for(app.gone.wait(), 10)

        stalled.close()
