"""A bad engine behind a real gateway: what an engine answers is hostile input too.

The engine is a socket server that writes exactly the bytes each story needs
(``tests.support.bad_engine``); the gateway is real (its own loop and server), and so is
its engine client. A head without end, an answer that claims to be no answer (101, a
status outside 100..599), a body past the bound: each is a 502 in OpenAI's shape and a
dropped engine connection, and the gateway serves the next request. Usage figures that are
no token counts charge what the request reserved, not nothing (or everything). A
``/metrics`` page without end, or too large, is a failed scrape, never read whole.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import aiohttp
import httpx
import openai
import pytest
from structlog.testing import capture_logs

from app.gateway.engine_bounds import MAX_ANSWER_BYTES
from app.gateway.server import StaticSource
from app.gateway.signals import MAX_PAGE_BYTES, EngineReading, MetricsScraper, ScrapeFailed
from app.gateway.table import Route
from tests.support.bad_engine import (
    GAUGE,
    HANG_UP,
    PAGE_HEAD,
    BadEngine,
    Sent,
    Story,
    endless_page,
    json_answer,
    sse_answer,
)
from tests.support.gateway import GatewayThread, new_key, snapshot_of

pytestmark = pytest.mark.timeout(60)

MODEL = "bad-engine-model"
TPM = 100_000
CHAT = b'{"id": "c", "object": "chat.completion", "choices": [], "usage": {"total_tokens": 0}}'


def request_body(note: str, *, stream: bool = False) -> bytes:
    """A chat request whose ``note`` the engine's story can tell apart; ``max_tokens`` 100."""
    fields: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": note}]}
    if stream:
        fields |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps({**fields, "max_tokens": 100}).encode()


def reserved(body: bytes) -> int:
    """What the gateway reserves for ``body`` at admission: bytes / 4 and ``max_tokens``."""
    return len(body) // 4 + 100


@contextmanager
def gateway_before(engine: BadEngine) -> Iterator[tuple[httpx.Client, GatewayThread]]:
    """A gateway whose one replica is ``engine``, and a client with a key limited to TPM."""
    key, record = new_key(tpm=TPM)
    route = Route(replica_id="bad-1", model=MODEL, url=engine.url)
    snapshot = snapshot_of([route], [record])
    with (
        GatewayThread(StaticSource(snapshot), metrics_port=0) as gateway,
        httpx.Client(
            base_url=gateway.url,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=15,
        ) as client,
    ):
        yield client, gateway


def first_post_then_ok(first: Iterable[bytes]) -> Story:
    """``first`` answers the request noted ``first``; any other gets a plain answer."""

    def story(request: bytes) -> Iterable[bytes]:
        return first if b'"first"' in request else [json_answer(CHAT)]

    return story


def refused_as_invalid(answer: httpx.Response, says: str) -> None:
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_invalid_answer")
    assert says in error["message"]
    assert answer.headers["x-request-id"].startswith("req_")


# -- answer heads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endless",
    [
        pytest.param(b"x-endless: " + b"a" * (2 << 20), id="one-endless-header"),
        pytest.param(b"x-many: header\r\n" * (128 << 10), id="header-after-header"),
    ],
)
def test_an_answer_head_without_end_is_a_502_and_the_engine_connection_is_dropped(
    endless: bytes,
) -> None:
    # Before the bound the request hung for as long as the engine kept its connection,
    # the gateway's loop joining the pieces of an endless header over and over.
    story = first_post_then_ok([b"HTTP/1.1 200 OK\r\n", endless])
    with BadEngine(story) as engine, gateway_before(engine) as (client, _):
        answer = client.post("/chat/completions", content=request_body("first"))

        refused_as_invalid(answer, "answer head (status line and headers) is over 64 KiB")
        engine.wait_closed_after_post()
        after = client.post("/chat/completions", content=request_body("next"))
        assert after.status_code == 200, after.text


def test_interim_answers_are_skipped_and_the_real_one_relayed() -> None:
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n"
        b"content-type: text/html\r\n\r\n"
    )
    with (
        BadEngine(lambda request: [interim, json_answer(CHAT)]) as engine,
        gateway_before(engine) as (client, _),
    ):
        for note in ("first", "again"):  # the connection is fit for the next request
            answer = client.post("/chat/completions", content=request_body(note))

            assert answer.status_code == 200, answer.text
            assert answer.headers["content-type"] == "application/json"
            assert answer.content == CHAT


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n",
        b"HTTP/1.1 600 Beyond\r\n",
        b"HTTP/1.1 099 Below\r\n",
    ],
    ids=["101", "600", "099"],
)
def test_a_status_the_gateway_does_not_relay_is_a_502(status_line: bytes) -> None:
    answer_bytes = status_line + b"content-length: 2\r\n\r\n{}"
    with (
        BadEngine(first_post_then_ok([answer_bytes])) as engine,
        gateway_before(engine) as (client, _),
    ):
        answer = client.post("/chat/completions", content=request_body("first"))

        refused_as_invalid(answer, f"the engine answered status {status_line.split()[1].decode()}")
        engine.wait_closed_after_post()
        assert client.post("/chat/completions", content=request_body("next")).status_code == 200


@pytest.mark.parametrize(
    "version", [b"HTTP/2.0", b"HTTP/0.9"], ids=lambda version: version.decode()
)
def test_an_answer_in_another_http_than_1_0_or_1_1_is_a_502(version: bytes) -> None:
    # Was relayed as a 200: the head was read as if the engine spoke HTTP/1.1.
    answer_bytes = version + b" 200 OK\r\ncontent-type: application/json\r\n" + LENGTH
    with (
        BadEngine(first_post_then_ok([answer_bytes + b"\r\n" + CHAT])) as engine,
        gateway_before(engine) as (client, _),
    ):
        answer = client.post("/chat/completions", content=request_body("first"))

        refused_as_invalid(answer, f"the engine answered in {version.decode()}, not HTTP/1.1")
        engine.wait_closed_after_post()
        assert client.post("/chat/completions", content=request_body("next")).status_code == 200


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
def test_a_bodiless_answer_is_relayed_without_a_length_on_a_connection_kept_alive(
    status: bytes,
) -> None:
    # A 204 went out with content-length: 0, which RFC 9110 (8.6) forbids; on a 304 it
    # would have to be the length of the 200 the gateway never saw.
    key, record = new_key(tpm=TPM)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    )

    def story(request: bytes) -> Iterable[bytes]:
        if b'"first"' in request:
            return [b"HTTP/1.1 %s\r\ncontent-length: 0\r\n\r\n" % status]
        return [json_answer(CHAT)]

    with BadEngine(story) as engine:
        route = Route(replica_id="bad-1", model=MODEL, url=engine.url)
        with GatewayThread(StaticSource(snapshot_of([route], [record])), metrics_port=0) as gateway:
            host, port = gateway.base_url.removeprefix("http://").rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=15) as sock:
                answers = []
                for note in ("first", "next"):  # one connection: the 204's end was clear
                    body = request_body(note)
                    sock.sendall(request % (key.encode(), len(body), body))
                    answers.append(read_answer(sock))
            # The engine's connection served the next request too.
            assert engine.closed_after_post == 0

    head, body = answers[0]
    status_line, *fields = head.split(b"\r\n")
    assert status_line == b"HTTP/1.1 " + status
    names = {field.partition(b":")[0].lower() for field in fields}
    assert not names & {b"content-length", b"transfer-encoding", b"connection"}
    # Nor a content type the engine never sent: there is nothing it could describe.
    assert b"content-type" not in names
    assert body == b""
    assert answers[1] == (answers[1][0], CHAT)
    assert answers[1][0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert len(engine.posts) == 2


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One answer from ``sock``: its head, and its body as its content-length tells (none
    without one: a bodiless answer)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"the gateway closed the connection after {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for field in head.split(b"\r\n")[1:]:
        name, _, value = field.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece, "the gateway closed the connection mid-body"
        body += piece
    return head, body


def test_a_whole_answer_over_the_bound_is_a_502_without_reading_it() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    story = first_post_then_ok([head % (MAX_ANSWER_BYTES + 1), b"{" * 65536])
    with BadEngine(story) as engine, gateway_before(engine) as (client, _):
        answer = client.post("/chat/completions", content=request_body("first"))

        refused_as_invalid(answer, "over 256 MiB")
        engine.wait_closed_after_post()
        assert client.post("/chat/completions", content=request_body("next")).status_code == 200


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param([HANG_UP], id="the-engine-hangs-up"),
        pytest.param([b"zz\r\nnot a chunk", HANG_UP], id="what-follows-is-not-http"),
    ],
)
def test_a_whole_answer_that_breaks_off_is_a_502_saying_so(broken: list[bytes]) -> None:
    """The engine was reached, took the request and began its answer: "no replica could be
    reached", as the gateway said before, sent its operator looking at the network."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    begun = b'{"id": "c",'
    story = first_post_then_ok([head + b"%x\r\n%s\r\n" % (len(begun), begun), *broken])
    with BadEngine(story) as engine, gateway_before(engine) as (client, _):
        answer = client.post("/chat/completions", content=request_body("first"))

        assert answer.status_code == 502, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "upstream_disconnected")
        assert error["message"].startswith(f"A replica of `{MODEL}` broke off its answer: ")
        assert client.post("/chat/completions", content=request_body("next")).status_code == 200


LENGTH = b"content-length: %d\r\n" % len(CHAT)


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(LENGTH + LENGTH.replace(b"%d" % len(CHAT), b"2"), id="two-lengths"),
        pytest.param(LENGTH + b"transfer-encoding: chunked\r\n", id="length-and-chunks"),
        pytest.param(b"content-type: application/json\r\n set-cookie: a=b\r\n" + LENGTH, id="fold"),
        pytest.param(b"content-type: application/json\rset-cookie: a=b\r\n" + LENGTH, id="bare-cr"),
        pytest.param(b"content-type: application/json\nset-cookie: a=b\r\n" + LENGTH, id="bare-lf"),
        pytest.param(b"content-type: application/json\0\r\n" + LENGTH, id="nul"),
    ],
)
def test_an_answer_head_http_cannot_read_one_way_is_a_502_invalid_answer(head: bytes) -> None:
    # Was 502 upstream_unreachable, "No replica of `m` could be reached", of an engine that
    # had been reached and had answered.
    answer_bytes = b"HTTP/1.1 200 OK\r\n" + head + b"\r\n" + CHAT
    with (
        BadEngine(first_post_then_ok([answer_bytes])) as engine,
        gateway_before(engine) as (client, _),
    ):
        answer = client.post("/chat/completions", content=request_body("first"))

        refused_as_invalid(answer, "the engine's answer head is not HTTP the gateway reads")
        assert "set-cookie" not in answer.headers
        engine.wait_closed_after_post()
        assert client.post("/chat/completions", content=request_body("next")).status_code == 200


def test_of_an_engines_answer_head_only_its_status_and_content_type_reach_the_client() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nset-cookie: session=engine\r\n"
        b"connection: keep-alive, x-hop\r\nx-hop: 1\r\nupgrade: h2c\r\nkeep-alive: timeout=1\r\n"
        b"proxy-authenticate: Basic\r\nx-request-id: engine-chosen\r\n"
    )
    with (
        BadEngine(lambda request: [head + LENGTH + b"\r\n" + CHAT]) as engine,
        gateway_before(engine) as (client, _),
    ):
        answer = client.post("/chat/completions", content=request_body("first"))

    assert answer.status_code == 200, answer.text
    assert answer.content == CHAT
    names = set(answer.headers)
    assert not names & {"set-cookie", "x-hop", "upgrade", "keep-alive", "proxy-authenticate"}
    assert answer.headers["x-request-id"].startswith("req_")


def test_bytes_after_an_answer_are_nobody_elses_answer_and_close_the_connection() -> None:
    # An engine whose length is short of its body, or that answers a request never sent:
    # what follows the answer is no answer to the next request (response queue poisoning).
    poison = json_answer(b'"poison"')
    story = first_post_then_ok([json_answer(CHAT), poison])
    with BadEngine(story) as engine, gateway_before(engine) as (client, _):
        first = client.post("/chat/completions", content=request_body("first"))
        engine.wait_closed_after_post()
        after = client.post("/chat/completions", content=request_body("next"))

    assert (first.status_code, first.content) == (200, CHAT)
    assert (after.status_code, after.content) == (200, CHAT)


def raw_request(gateway: GatewayThread, request: bytes) -> bytes:
    """The status line the gateway answers ``request`` (bytes as sent) with."""
    host, port = gateway.base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
    return answer.partition(b"\r\n")[0]


@pytest.mark.parametrize(
    ("target", "served"),
    [
        (b"/v1/chat/completions/../../metrics", False),
        (b"/v1/%2e%2e/metrics", False),
        (b"/v1/chat/completions/%2e%2e/%2e%2e/health", False),
        (b"//v1/chat/completions", False),
        (b"/v1//chat/completions", False),
        (b"/v1/chat/completions%00", False),
        (b"/metrics", False),
        (b"/health", False),
        (b"/tokenize", False),
        (b"/v1/load_lora_adapter", False),
        (b"/v1/chat/completions#/metrics", True),
        (b"/v1/chat/completions?next=/metrics", True),
        (b"/v1/chat%2fcompletions", True),
        (b"http://127.0.0.9:1/v1/chat/completions", True),
    ],
)
def test_a_client_reaches_the_engine_only_on_a_served_route_with_the_gateways_own_head(
    target: bytes, served: bool
) -> None:
    key, record = new_key(tpm=TPM)
    body = request_body("first")
    request = (
        b"POST %s HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n"
        b"Upgrade: h2c\r\nTE: trailers\r\nX-Request-Id: chosen\r\nCookie: c=1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
        % (target, key.encode(), len(body), body)
    )
    with BadEngine(lambda request: [json_answer(CHAT)]) as engine:
        route = Route(replica_id="bad-1", model=MODEL, url=engine.url)
        with GatewayThread(StaticSource(snapshot_of([route], [record])), metrics_port=0) as gateway:
            status = raw_request(gateway, request)

    if not served:
        assert status == b"HTTP/1.1 404 Not Found"
        assert engine.posts == []
        return
    assert status == b"HTTP/1.1 200 OK"
    [sent] = engine.posts
    head, _, sent_body = sent.partition(b"\r\n\r\n")
    request_line, *fields = head.split(b"\r\n")
    assert request_line == b"POST /v1/chat/completions HTTP/1.1"
    names = [field.partition(b":")[0] for field in fields]
    assert names == [b"host", b"content-type", b"content-length", b"x-request-id"]
    assert b"x-request-id: req_" in head
    assert sent_body == body


# -- engines' errors ---------------------------------------------------------------------------


def route_to(engine: BadEngine) -> Route:
    return Route(replica_id="bad-1", model=MODEL, url=engine.url)


@pytest.mark.parametrize(
    ("status", "error", "type_", "code", "logged"),
    [
        pytest.param(
            b"400 Bad Request",
            b'{"object": "error", "message": "This model\'s maximum context length is 4096",'
            b' "type": "BadRequestError", "param": null, "code": 400}',
            "invalid_request_error",
            "context_length_exceeded",  # a 4xx over the context: OpenAI's code
            "type=BadRequestError code=400",
            id="vllm",
        ),
        pytest.param(
            b"500 Internal Server Error",
            b'{"error": {"code": 500, "message": "This model\'s maximum context length is 4096",'
            b' "type": "exceed_context_size_error", "n_ctx": 4096}}',
            "server_error",
            None,  # a 5xx is the engine failing, whatever it says
            "type=exceed_context_size_error code=500",
            id="llama.cpp",
        ),
    ],
)
def test_an_engines_error_has_openais_type_and_its_own_is_in_the_request_log_line(
    status: bytes, error: bytes, type_: str, code: str | None, logged: str
) -> None:
    # The engine's own type reached the client, an integer code its operator never saw.
    key, record = new_key(tpm=TPM)
    with (
        BadEngine(lambda request: [json_answer(error, status)]) as engine,
        capture_logs() as logs,
        GatewayThread(
            StaticSource(snapshot_of([route_to(engine)], [record])),
            metrics_port=0,
            log_requests=True,
        ) as gateway,
        openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
        pytest.raises(openai.APIStatusError) as raised,
    ):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )

    assert raised.value.status_code == int(status.split()[0])
    assert raised.value.type == type_
    assert raised.value.code == code
    assert raised.value.message.endswith("This model's maximum context length is 4096")
    [line] = [entry for entry in logs if entry["event"] == "gateway_request"]
    assert line["note"] == f"the engine's error said {logged}"


FIRST_CHUNK = (
    b'{"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0,'
    b' "delta": {"content": "error"}, "finish_reason": null}]}'
)


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(
            b'{"error": {"object": "error", "message": "The engine ran out of KV cache",'
            b' "type": "BadRequestError", "param": null, "code": 400}}',
            id="vllm",
        ),
        pytest.param(
            b'{"object": "error", "message": "The engine ran out of KV cache",'
            b' "type": "BadRequestError", "param": null, "code": 400}',
            id="vllm-old",
        ),
    ],
)
def test_an_engines_error_event_mid_stream_has_openais_shape_and_type(event: bytes) -> None:
    # Relayed as the engine wrote it: the SDK raised with type "BadRequestError", or (the
    # older shape, no "error" key) did not raise at all and read the error as a chunk.
    key, record = new_key(tpm=TPM)
    with (
        BadEngine(lambda request: [sse_answer(FIRST_CHUNK, event)]) as engine,
        capture_logs() as logs,
        GatewayThread(
            StaticSource(snapshot_of([route_to(engine)], [record])),
            metrics_port=0,
            log_requests=True,
        ) as gateway,
        openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
    ):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        contents: list[str | None] = []

        def read_all() -> None:
            contents.extend(chunk.choices[0].delta.content for chunk in stream)

        with pytest.raises(openai.APIError) as raised:
            read_all()

    assert contents == ["error"], "a chunk whose content is the word is no error"
    assert raised.value.message == "The engine ran out of KV cache"
    assert (raised.value.type, raised.value.code) == ("invalid_request_error", None)
    [line] = [entry for entry in logs if entry["event"] == "gateway_request"]
    assert line["note"] == "the engine's error said type=BadRequestError code=400"


# -- usage figures --------------------------------------------------------------------------


def remaining_tokens(client: httpx.Client) -> int:
    """The key's tokens left, as a next request's answer says (its own usage is 0)."""
    answer = client.post("/chat/completions", content=request_body("next"))
    assert answer.status_code == 200, answer.text
    return int(answer.headers["x-ratelimit-remaining-tokens"])


def unusable_count(gateway: GatewayThread) -> float:
    page = httpx.get(gateway.metrics_url).text
    series = f'llmgw_gateway_engine_usage_unusable_total{{model="{MODEL}"}} '
    lines = [line for line in page.splitlines() if line.startswith(series)]
    return float(lines[0].removeprefix(series)) if lines else 0.0


@pytest.mark.parametrize(
    "figure",
    [
        pytest.param(b"-1000000", id="negative"),  # was charged nothing: free
        pytest.param(b"1.5", id="fraction"),  # was charged nothing
        pytest.param(b"1e30", id="exponent"),  # was charged nothing
        pytest.param(b"1000000000000", id="over-1e9"),  # locked the key out for a minute
        pytest.param(b"1" + b"0" * 400, id="past-a-float"),  # was a 500: the count overflowed
    ],
)
def test_a_whole_answers_unusable_usage_charges_its_reservation(figure: bytes) -> None:
    usage = b'{"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "total_tokens": %s}}'
    first = json_answer(usage % figure)
    body = request_body("first")
    with (
        BadEngine(first_post_then_ok([first])) as engine,
        gateway_before(engine) as (client, gateway),
    ):
        answer = client.post("/chat/completions", content=body)

        assert answer.status_code == 200, answer.text
        assert answer.content == usage % figure  # relayed as the engine wrote it
        assert remaining_tokens(client) == TPM - reserved(body)
        assert unusable_count(gateway) == 1


def test_a_whole_answers_usable_usage_is_charged() -> None:
    first = json_answer(b'{"choices": [], "usage": {"prompt_tokens": 5, "total_tokens": 42}}')
    with (
        BadEngine(first_post_then_ok([first])) as engine,
        gateway_before(engine) as (client, gateway),
    ):
        assert client.post("/chat/completions", content=request_body("first")).status_code == 200

        assert remaining_tokens(client) == TPM - 42
        assert unusable_count(gateway) == 0


@pytest.mark.parametrize(
    ("figure", "charged"),
    [
        pytest.param(b"8", 8, id="usable"),
        pytest.param(b"7.9", 3, id="fraction"),  # was charged 7
        pytest.param(b"1e30", 3, id="exponent"),  # was charged 1
        pytest.param(b"1000000000000", 3, id="over-1e9"),  # locked the key out
        pytest.param(b"-5", 3, id="negative"),
    ],
)
def test_a_streams_unusable_usage_charges_one_token_per_event(figure: bytes, charged: int) -> None:
    stream = sse_answer(
        b'{"choices": [{"delta": {"content": "a"}}]}',
        b'{"choices": [{"delta": {"content": "b"}}]}',
        b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, '
        b'"total_tokens": %s}}' % figure,
    )
    with (
        BadEngine(first_post_then_ok([stream])) as engine,
        gateway_before(engine) as (client, gateway),
    ):
        answer = client.post("/chat/completions", content=request_body("first", stream=True))

        assert answer.status_code == 200, answer.text
        assert answer.text.endswith("data: [DONE]\n\n")
        assert remaining_tokens(client) == TPM - charged
        assert unusable_count(gateway) == (0 if charged == 8 else 1)


# -- streams cut short ---------------------------------------------------------------------

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def delta(content: bytes) -> bytes:
    return (
        b'data: {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", '
        b'"choices": [{"index": 0, "delta": {"content": "%s"}}]}' % content
    )


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda event, end: [event[:40]], id="in-an-event"),
        pytest.param(lambda event, end: [event[:3], event[3:40]], id="in-pieces"),
        pytest.param(lambda event, end: [event + end[:1]], id="before-its-blank-line"),
        pytest.param(lambda event, end: [b"", event[:40]], id="after-an-empty-piece"),
    ],
)
def test_an_engine_dying_mid_event_ends_the_stream_with_an_error_event_of_its_own(
    newline: bytes, cut: Callable[[bytes, bytes], list[bytes]]
) -> None:
    end = newline * 2
    sent = [delta(b"a") + end + delta(b"b") + end, *cut(delta(b"c"), end)]
    story = [STREAM_HEAD, *(chunked(piece) for piece in sent if piece), HANG_UP]
    with (
        BadEngine(first_post_then_ok(story)) as engine,
        gateway_before(engine) as (client, gateway),
        openai.OpenAI(
            base_url=gateway.url,
            api_key=client.headers["authorization"].removeprefix("Bearer "),
            max_retries=0,
        ) as sdk,
    ):
        stream = sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "first"}], stream=True
        )
        received: list[str | None] = []
        with pytest.raises(openai.APIError) as raised:
            received.extend(part.choices[0].delta.content for part in stream)

    # Was a JSONDecodeError: half an event and the gateway's error event, read as one.
    assert received == ["a", "b"]
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["code"] == "upstream_disconnected"


# -- the /metrics page the gateway scrapes --------------------------------------------------

SCRAPE_TIMEOUT_S = 3.0


def scraper_of(engine: BadEngine, session: aiohttp.ClientSession) -> MetricsScraper:
    return MetricsScraper(
        replica_id="bad-1",
        url=engine.url,
        session=session,
        interval_s=0.25,
        timeout_s=SCRAPE_TIMEOUT_S,
        begin=lambda: 0,
        report=lambda sequence, reading: None,
    )


async def scrape(engine: BadEngine) -> tuple[EngineReading | ScrapeFailed, float]:
    """One scrape of ``engine``: its reading or failure, and how long it took."""
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        try:
            outcome: EngineReading | ScrapeFailed = await scraper_of(engine, session).scrape_once()
        except ScrapeFailed as exc:
            outcome = exc
        return outcome, time.monotonic() - started


async def test_a_metrics_page_without_end_is_refused_past_16_mib() -> None:
    # Before the bound the scraper read all that came until its timeout: 64 MiB here, as
    # much as the engine could send in a second on loopback, four times a second.
    sent = Sent()
    with BadEngine(first_post_then_ok([]), metrics=endless_page(sent)) as engine:
        outcome, took_s = await scrape(engine)

    assert isinstance(outcome, ScrapeFailed), outcome
    assert "goes on past 16 MiB" in str(outcome)
    assert took_s < SCRAPE_TIMEOUT_S
    assert sent.bytes < MAX_PAGE_BYTES + (16 << 20)  # what the sockets' buffers hold


async def test_a_metrics_page_declaring_more_than_16_mib_is_not_read() -> None:
    head = PAGE_HEAD + b"content-length: %d\r\n\r\n" % (MAX_PAGE_BYTES + 1)
    with BadEngine(first_post_then_ok([]), metrics=lambda request: [head, GAUGE]) as engine:
        outcome, took_s = await scrape(engine)

    assert isinstance(outcome, ScrapeFailed), outcome
    assert f"declares {MAX_PAGE_BYTES + 1} bytes, over 16 MiB" in str(outcome)
    assert took_s < SCRAPE_TIMEOUT_S


async def test_a_metrics_page_sent_a_line_at_a_time_ends_with_the_scrape_timeout() -> None:
    def trickle(request: bytes) -> Iterator[bytes]:
        yield PAGE_HEAD + b"transfer-encoding: chunked\r\n\r\n"
        for _ in range(int(10 * SCRAPE_TIMEOUT_S)):
            time.sleep(0.2)
            yield b"%x\r\n%s\r\n" % (len(GAUGE), GAUGE)

    with BadEngine(first_post_then_ok([]), metrics=trickle) as engine:
        outcome, took_s = await scrape(engine)

    assert isinstance(outcome, ScrapeFailed), outcome
    assert "TimeoutError" in str(outcome)
    assert took_s < SCRAPE_TIMEOUT_S + 1


async def test_a_metrics_page_under_the_bound_is_read() -> None:
    page = GAUGE + b"# filler\n" * ((MAX_PAGE_BYTES - 4096) // 9)
    answer = PAGE_HEAD + b"content-length: %d\r\n\r\n" % len(page)
    with BadEngine(first_post_then_ok([]), metrics=lambda request: [answer, page]) as engine:
        outcome, _ = await scrape(engine)

    assert isinstance(outcome, EngineReading), outcome
    assert outcome.waiting == 0.0
