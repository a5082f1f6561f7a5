"""A bad engine behind a real gateway: what an engine answers is hostile input too.

The engine is a socket server that writes exactly the bytes each story needs
(``tests.support.bad_engine``); the gateway is real (its own loop and server), and so is
its engine client. A head without end, an answer that claims to be no answer (101, a
status outside 100..599), a body past the bound: each is a 502 in OpenAI's shape and a
dropped engine connection, and the gateway serves the next request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from app.gateway.engine_client import MAX_ANSWER_BYTES
from app.gateway.server import StaticSource
from app.gateway.table import Route
from tests.support.bad_engine import BadEngine, Story, json_answer
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


def test_a_whole_answer_over_the_bound_is_a_502_without_reading_it() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    story = first_post_then_ok([head % (MAX_ANSWER_BYTES + 1), b"{" * 65536])
    with BadEngine(story) as engine, gateway_before(engine) as (client, _):
        answer = client.post("/chat/completions", content=request_body("first"))

        refused_as_invalid(answer, "over 256 MiB")
        engine.wait_closed_after_post()
        assert client.post("/chat/completions", content=request_body("next")).status_code == 200
