"""``POST /v1/audio/transcriptions``: a multipart upload, passed to the engine as it arrives.

The gateway never holds an upload whole. It reads the form's fields up to the start of its
first file (at most ``MAX_FORM_HEAD_BYTES``), which is where it finds the ``model`` it
routes by, so **``model`` must come before the file** in the form: the ``openai`` SDK and
``curl -F model=... -F file=@...`` both send it so. A form without a file (a part with a
filename) is refused there: no engine could transcribe it. It then checks the key, the
model and the rate limits, takes a replica as for any request, and sends the engine what
it read followed by the rest of the body as the client sends it, at the engine's pace (a
paused read holds the client back through the HTTP server's own flow control). An upload over
``max_upload_bytes`` is 413: at once when its ``Content-Length`` says so, else when the
limit is passed, and its engine connection is closed.

A client that leaves mid-upload, or while the engine transcribes, cancels the request:
the upload's reader sees the disconnect while it reads, the disconnect watch afterwards. The answer
is relayed as it comes: a stream (``text/event-stream``) chunk by chunk, any other answer
whole.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from functools import partial

from app.gateway.asgi import (
    AUTHORIZATION,
    Receive,
    Scope,
    Send,
    repeated_authorization,
)
from app.gateway.disconnect import DisconnectWatch, disconnect_listener
from app.gateway.endpoints import UPLOAD_ENDPOINTS
from app.gateway.errors import (
    body_too_large,
    invalid_request,
)
from app.gateway.exchange import CompletionExchange
from app.gateway.exchange_steps import ExchangeSteps
from app.gateway.proxy import Opened
from app.gateway.request_body import ClientGoneBeforeBody
from app.gateway.route_refusals import RouteRefused
from app.gateway.served_route import ServedRoute
from app.listeners.limits import announces_more_than
from wire.multipart import (
    BodyEnded,
    MalformedMultipart,
    MultipartReader,
    PartData,
    PartEnded,
    PartStarted,
    boundary_of,
)

MAX_FORM_HEAD_BYTES = 64 * 1024
"""The form's fields before its file: a model name and a few options fit in far less."""
MAX_FIELD_BYTES = 1024
"""One field's value the gateway keeps (``model``)."""
DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024 * 1024
"""An upload's whole body by default: OpenAI takes audio files up to 25 MB."""
MAX_UPLOAD_BYTES = 16 * 1024 * 1024 * 1024
"""The most ``max_upload_bytes`` may be set to (16 GiB)."""


class FormHead:
    """What the gateway read of a form before its file: the bytes, and the ``model``."""

    __slots__ = ("complete", "model", "raw")

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.model: str | None = None
        self.complete = False
        """The whole body was read (a small form): nothing more is to be received."""


async def read_form_head(receive: Receive, content_type: str) -> FormHead:
    """Read the body up to the start of its first file part; ``model`` must come before it.
    400 for a body that is not multipart/form-data, names no model first, or has no file."""
    try:
        reader = MultipartReader(boundary_of(content_type))
    except MalformedMultipart as exc:
        raise invalid_request(f"Invalid upload: {exc}.") from None
    head = FormHead()
    size = 0
    field: str | None = None
    value = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGoneBeforeBody
        chunk: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        head.raw.append(chunk)
        size += len(chunk)
        try:
            events = reader.feed(chunk)
        except MalformedMultipart as exc:
            raise invalid_request(f"Invalid upload: {exc}.") from None
        # The whole body may be in hand already (a small form, in one piece): then there is
        # nothing more to receive, and asking would wait for the client to hang up.
        head.complete = not more
        for event in events:
            if isinstance(event, PartStarted):
                if event.filename is not None:
                    return _with_model(head)
                field = event.name
                value.clear()
            elif isinstance(event, PartData) and field == "model":
                value += event.data
                if len(value) > MAX_FIELD_BYTES:
                    raise invalid_request(
                        f"The `model` field is longer than {MAX_FIELD_BYTES} bytes.", param="model"
                    )
            elif isinstance(event, PartEnded) and field == "model":
                head.model = value.decode("utf-8", errors="replace").strip()
                field = None
            elif isinstance(event, BodyEnded):
                # Complete, and no file in it: nothing an engine could transcribe.
                _with_model(head)
                raise invalid_request(
                    "The form has no file: send it as the `file` part, with a filename.",
                    param="file",
                )
        if not more:
            raise invalid_request("Invalid upload: the body ends before its closing boundary.")
        if size > MAX_FORM_HEAD_BYTES:
            raise invalid_request(
                f"The form's fields before its file exceed {MAX_FORM_HEAD_BYTES} bytes."
            )


def _with_model(head: FormHead) -> FormHead:
    if not head.model:
        raise invalid_request(
            "The form must have a `model` field before its file: the gateway routes by it "
            "without reading the upload whole.",
            param="model",
        )
    return head


class _Upload:
    """The client's body as it goes to the engine: what was read already, then the rest."""

    __slots__ = (
        "_head",
        "_limit",
        "_on_uploaded",
        "_receive",
        "content_length",
        "content_type",
        "started",
    )

    def __init__(
        self,
        head: FormHead,
        receive: Receive,
        content_type: bytes,
        content_length: int | None,
        limit: int,
        on_uploaded: Callable[[], None],
    ) -> None:
        self._head = head
        self._receive = receive
        self._limit = limit
        self._on_uploaded = on_uploaded
        self.content_type = content_type
        self.content_length = content_length
        self.started = False

    async def body(self) -> AsyncGenerator[bytes, None]:
        self.started = True
        size = 0
        for chunk in self._head.raw:
            size += len(chunk)
            yield chunk
        if self._head.complete:
            self._on_uploaded()
            return
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientGoneBeforeBody
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._limit:
                raise body_too_large(self._limit)
            yield chunk
            if not message.get("more_body", False):
                self._on_uploaded()
                return


class Uploads(ServedRoute):
    """Serves uploads by ``steps``, the key, model and rate-limit checks, the relay, the
    accounting and the log line that completion requests go through too."""

    def __init__(
        self, steps: ExchangeSteps, *, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    ) -> None:
        super().__init__(steps)
        self.max_upload_bytes = max_upload_bytes

    async def handle(
        self,
        exchange: CompletionExchange,
        watch: DisconnectWatch,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        steps = self.steps
        snapshot = steps.snapshot()
        authorization, content_type, length = _request_headers(scope)
        key = exchange.key = steps.keys.check(snapshot, authorization, scope)
        content_length = _content_length(length, self.max_upload_bytes)
        head = await read_form_head(receive, content_type)
        assert head.model is not None
        path: str = scope["path"]
        endpoint = UPLOAD_ENDPOINTS[path]
        steps.check_model(snapshot, key, head.model, endpoint.api, path)
        exchange.model = head.model
        # Watched from now on where the server calls back (or no body is left to read),
        # so that a client leaving while the request waits for a grant of its key's
        # limits, or for a replica (held for a cold start, or for room), gives its place
        # up; else once the body is read, as ``receive`` carries both the body and the
        # disconnect.
        watched_early = head.complete or disconnect_listener(scope) is not None
        if watched_early:
            watch.start(scope, receive)
        await steps.admit(exchange, key)
        await self._relay(
            exchange,
            endpoint.engine_path,
            head,
            content_type,
            content_length,
            watch,
            # Else the body is all read once uploaded: only a disconnect can come then.
            _nothing if watched_early else partial(watch.start, scope, receive),
            receive,
            send,
        )

    async def _relay(
        self,
        exchange: CompletionExchange,
        path: str,
        head: FormHead,
        content_type: str,
        content_length: int | None,
        watch: DisconnectWatch,
        uploaded: Callable[[], None],
        receive: Receive,
        send: Send,
    ) -> None:
        """Send the upload to a replica and relay its answer; ``uploaded`` is called once
        the body is all read."""
        assert exchange.key is not None
        key = exchange.key
        upload = _Upload(
            head,
            receive,
            content_type.encode("latin-1"),
            content_length,
            self.max_upload_bytes,
            uploaded,
        )
        await self.steps.relay(
            exchange,
            key,
            send,
            watch,
            lambda: self._open_upload(exchange, key.key_id, path, upload),
            lambda opened: (
                opened.answer.status == 200
                and opened.answer.content_type.startswith(b"text/event-stream")
            ),
        )

    async def _open_upload(
        self, exchange: CompletionExchange, key_id: str, path: str, upload: _Upload
    ) -> Opened:
        upstream = self.steps.started_upstream()
        model = exchange.model
        try:
            return await upstream.open_upload(
                model, key_id, path, upload, exchange.request_id.decode(), exchange.timing
            )
        except RouteRefused as exc:
            raise self.steps.refused(exchange, exc) from None


def _nothing() -> None:
    pass


def _request_headers(scope: Scope) -> tuple[bytes | None, str, bytes | None]:
    """The request's ``Authorization`` (400 when it comes more than once:
    ``app.gateway.asgi.authorization_of``), its content type and its ``Content-Length``:
    one walk of the headers for all three, which ASGI gives as any iterable, one that can
    be walked only once included."""
    authorization: bytes | None = None
    content_type = ""
    length: bytes | None = None
    for name, value in scope["headers"]:
        if name == AUTHORIZATION:
            if authorization is not None:
                raise repeated_authorization()
            authorization = value
        elif name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-length" and (length is None or length.isdigit()):
            length = value  # one that is not a number is kept, to be refused
    return authorization, content_type, length


def _content_length(value: bytes | None, limit: int) -> int | None:
    """The request's length (None: chunked); 400 for one that is not a number, 413 for one
    over ``limit``, thousands of digits that ``int()`` refuses included."""
    if value is None:
        return None
    if not value.isdigit():
        raise invalid_request("The Content-Length header is not a number.")
    if announces_more_than(value, limit):
        raise body_too_large(limit)
    return int(value)
