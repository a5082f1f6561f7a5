"""How the gateway finds an upload's model: in the form's fields before its file, read
without reading the file."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from app.gateway.asgi import KeyCheck, Message, Scope
from app.gateway.errors import ApiError
from app.gateway.exchange_steps import ExchangeSteps
from app.gateway.metrics import GatewayMetrics
from app.gateway.ratelimit import RateLimiter
from app.gateway.route_refusals import NoServingReplica
from app.gateway.table import GatewaySnapshot
from app.gateway.uploads import MAX_FORM_HEAD_BYTES, Uploads, read_form_head
from tests.support.gateway import new_key

BOUNDARY = "llmgw-boundary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def field(name: str, value: bytes) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
    return head.encode() + value + b"\r\n"


def file_part(size: int) -> bytes:
    head = (
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; "
        'name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
    )
    return head.encode() + b"a" * size + b"\r\n"


END = f"--{BOUNDARY}--\r\n".encode()


class Client:
    """The ASGI ``receive`` of a client sending ``body`` in pieces of ``piece`` bytes."""

    def __init__(self, body: bytes, piece: int = 1000) -> None:
        self._pieces: Iterator[bytes] = iter(
            [body[i : i + piece] for i in range(0, len(body), piece)] or [b""]
        )
        self._left = -(-len(body) // piece)
        self.received = 0

    async def __call__(self) -> Message:
        chunk = next(self._pieces, None)
        if chunk is None:
            raise AssertionError("the gateway read past the end of the body")
        self.received += len(chunk)
        self._left -= 1
        return {"type": "http.request", "body": chunk, "more_body": self._left > 0}


async def test_the_model_before_the_file_is_found_without_reading_the_file() -> None:
    body = field("model", b"whisper-1") + field("language", b"en") + file_part(10**6) + END
    client = Client(body)

    head = await read_form_head(client, CONTENT_TYPE)

    assert head.model == "whisper-1"
    assert not head.complete
    assert client.received < 2000
    assert b"".join(head.raw) == body[: client.received]


async def refused(body: bytes, content_type: str = CONTENT_TYPE) -> ApiError:
    with pytest.raises(ApiError) as raised:
        await read_form_head(Client(body), content_type)
    assert raised.value.status == 400
    return raised.value


async def test_a_model_after_the_file_is_refused_saying_where_it_must_be() -> None:
    error = await refused(file_part(5000) + field("model", b"whisper-1") + END)
    assert error.param == "model"
    assert "`model` field before its file" in error.message


async def test_a_form_without_a_model_is_refused() -> None:
    error = await refused(field("language", b"en") + END)
    assert error.param == "model"


async def test_a_body_that_is_not_multipart_is_refused() -> None:
    error = await refused(b'{"model": "whisper-1"}', "application/json")
    assert "must be multipart/form-data, not application/json" in error.message


async def test_a_broken_form_is_refused_saying_why() -> None:
    error = await refused(f"--{BOUNDARY}\r\nno colon\r\n\r\n".encode() + END)
    assert "no colon" in error.message


async def test_a_form_that_ends_early_is_refused() -> None:
    error = await refused(field("model", b"whisper-1")[:-5])
    assert "ends before its closing boundary" in error.message


async def test_fields_before_the_file_are_bounded() -> None:
    body = field("prompt", b"x" * 2 * MAX_FORM_HEAD_BYTES) + field("model", b"m") + END
    error = await refused(body)
    assert f"exceed {MAX_FORM_HEAD_BYTES} bytes" in error.message


async def test_an_overlong_model_is_refused() -> None:
    error = await refused(field("model", b"m" * 5000) + END)
    assert error.param == "model"


async def test_a_small_form_that_came_in_one_piece_is_read_whole() -> None:
    body = field("model", b"whisper-1") + file_part(100) + END
    client = Client(body, piece=len(body))

    head = await read_form_head(client, CONTENT_TYPE)

    # Nothing more will come: the upload must not wait for more from the client.
    assert head.complete
    assert b"".join(head.raw) == body


@pytest.mark.parametrize("piece", [7, 1000])
async def test_a_form_without_a_file_is_refused_once_its_closing_boundary_is_read(
    piece: int,
) -> None:
    # No engine could transcribe it: it is refused here, not sent on. A part named
    # ``file`` without a filename is a plain field, to the gateway as to an engine.
    body = field("model", b" whisper-1 ") + field("file", b"abc") + END + b"an epilogue"
    with pytest.raises(ApiError) as raised:
        await read_form_head(Client(body, piece=piece), CONTENT_TYPE)
    assert (raised.value.status, raised.value.param) == (400, "file")
    assert raised.value.message.startswith("The form has no file")


class NoReplicas:
    """The upstream: records each upload that would have gone to an engine (its model and
    framing), then finds no replica for it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, bytes, int | None]] = []

    async def open_upload(self, model: str, key_id: str, path: str, upload: Any, *args: Any) -> Any:
        self.asked.append((model, upload.content_type, upload.content_length))
        raise NoServingReplica(model)


UPLOAD = field("model", b"m") + file_part(10) + END


async def upload(headers: Iterable[tuple[bytes, bytes]]) -> tuple[NoReplicas, list[Message]]:
    """``UPLOAD`` sent with ``headers`` and a valid key to an ``Uploads`` whose model has no
    replica: what would have gone to an engine, and what the client got."""
    key, record = new_key()
    snapshot = GatewaySnapshot(
        declared=frozenset({"m"}),
        apis={"m": frozenset({"transcriptions"})},
        keys={record.prefix: record},
    )
    steps = ExchangeSteps(
        snapshot=lambda: snapshot, metrics=GatewayMetrics(), limiter=RateLimiter(), keys=KeyCheck()
    )
    app = Uploads(steps)
    upstream = NoReplicas()
    steps.upstream = upstream  # type: ignore[assignment]
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/audio/transcriptions",
        "headers": itertools.chain([(b"authorization", f"Bearer {key}".encode())], headers),
        "client": ("127.0.0.1", 50000),
    }
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, Client(UPLOAD), send)
    return upstream, sent


async def test_headers_given_as_an_iterable_that_walks_once_are_read_whole() -> None:
    # ASGI gives the headers as any iterable. They were walked twice, once for the key and
    # once for the framing: from an iterator, the second walk found no content type, and
    # the upload was refused as not multipart.
    upstream, sent = await upload(
        [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", b"%d" % len(UPLOAD))]
    )

    assert upstream.asked == [("m", CONTENT_TYPE.encode(), len(UPLOAD))]
    assert sent[0]["status"] == 503


async def test_a_length_of_thousands_of_digits_is_too_large_not_a_crash() -> None:
    # int() refuses more than 4,300 digits: the ValueError was a 500, logged as the
    # gateway's own failure.
    upstream, sent = await upload(
        [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", b"9" * 5000)]
    )

    assert upstream.asked == []
    assert sent[0]["status"] == 413
    assert b"exceeds" in sent[1]["body"]
