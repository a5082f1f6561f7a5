"""``POST /v1/chat/completions`` and ``POST /v1/completions``: the gateway's hot path; and
the other requests whose JSON body names the model (embeddings, responses, rerank, score,
tokenize, detokenize: ``app.gateway.endpoints``), served the same way.

A request costs one header scan and one SHA-256 for the key, one msgspec decode that reads
only ``model`` and ``stream`` (the body itself goes to the engine byte for byte), the rate
limiter, the router's choice, one write to the engine, and one log line.

A client that disconnects cancels its request: once the body is read, the request's task
is cancelled wherever it is (waiting for a grant of its key's limits, queued for a replica,
waiting for the engine's first byte, or mid-stream) when the client goes; closing the
upstream connection is what tells the engine to abort. The listeners' server says so by a
callback (``ON_DISCONNECT``), which costs no task; under another ASGI server a watcher task
waits for ``http.disconnect`` instead.

How each answer ended is counted against its replica in the gateway's ``TrafficWindow``
(``_count``): answered, failed (a 5xx or 429, or an answer that broke off) or cancelled by
the client (abandoned when none of the answer had come), with the times measured from
sending the request to the engine. For a stream, TTFT is the first chunk of its body and
TPOT the time from there to its end per output token after the first; the latency of a 2xx
answer is to its last byte. What is measured
and why is in docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
import structlog

from app.domain.traffic import Outcome, outcome_of_status
from app.gateway.affinity import SESSION_HEADER, RouteKey, route_key
from app.gateway.asgi import (
    AUTHORIZATION,
    Header,
    KeyCheck,
    Receive,
    Scope,
    Send,
    clock,
    refuse,
    repeated_authorization,
    request_id,
)
from app.gateway.endpoints import JSON_ENDPOINTS
from app.gateway.errors import (
    ApiError,
    api_not_served,
    body_too_large,
    cold_start_timed_out,
    gateway_stopping,
    internal_error,
    invalid_request,
    model_not_found,
    no_serving_replica,
    quota_exceeded,
    quota_reason,
    rate_limit_headers,
    saturated,
)
from app.gateway.lease import Lease
from app.gateway.metrics import CLIENT_GONE, GatewayMetrics
from app.gateway.proxy import Opened, Timing, Upstream, read_whole, relay_stream
from app.gateway.ratelimit import ALLOWED_UNLIMITED, Limiter
from app.gateway.route_refusals import (
    ColdStartTimedOut,
    GatewayStopping,
    ModelRemoved,
    NoServingReplica,
    RouteRefused,
    Saturated,
)
from app.gateway.table import GatewaySnapshot, KeyRecord
from app.gateway.traffic import TrafficWindow
from app.gateway.usage import StreamTokens, usage_of_body
from app.listeners.bom import LeadingMark, without_mark
from app.listeners.exchange import ON_DISCONNECT
from app.listeners.limits import announces_more_than
from app.logs import request_level

MAX_BODY_BYTES = 32 * 1024 * 1024
GRANT_WAIT_S = 0.25
"""How long a request that finds its key's slices spent waits for the grant on its way
before it is refused (``app.gateway.sharedlimits``)."""
ROUTE_HEADER = b"x-llmgw-route"
"""Asked for with any value but ``0``, answered with the routing decision (``route_header``)."""

log = structlog.get_logger("llmgw.gateway")


_ABSENT = msgspec.Raw(b"null")
"""A count field the body leaves out: this very object (``is``), never decoded."""


class RoutingFields(msgspec.Struct):
    """What the gateway reads of a request body; the engine reads the rest."""

    model: str
    stream: bool | None = None
    max_tokens: msgspec.Raw = _ABSENT
    max_completion_tokens: msgspec.Raw = _ABSENT
    max_output_tokens: msgspec.Raw = _ABSENT
    """Kept undecoded, read only for a tpm limit's reservation (``_token_estimate``): the
    engine checks them."""


_decode_fields = msgspec.json.Decoder(RoutingFields).decode
_decode_count = msgspec.json.Decoder(Annotated[int, msgspec.Meta(ge=0)]).decode


class ClientGoneBeforeBody(Exception):
    """The client disconnected before its request body arrived."""


def disconnect_listener(scope: Scope) -> Callable[[Callable[[], None]], None] | None:
    """The server's ``ON_DISCONNECT`` extension, where it has one: it calls back when the
    client leaves, without taking the request's body messages."""
    extensions = scope.get("extensions")
    return extensions.get(ON_DISCONNECT) if extensions else None


class DisconnectWatch:
    """Cancels the request's task when its client disconnects, from ``start`` until
    ``done``: while it waits for a grant of its key's limits, for a replica (in the queue,
    or held for a cold start), or for the engine's answer, and while it relays it."""

    __slots__ = ("done", "fired", "task", "watcher")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.done = False
        self.fired = False
        self.watcher: asyncio.Task[None] | None = None
        """The task that waits for ``http.disconnect``, where the server has no callback."""

    def start(self, scope: Scope, receive: Receive) -> None:
        """Watch from now on: by the server's callback where it has one (no task), else by
        a task that waits for ``http.disconnect`` (so only once the body is all read)."""
        on_disconnect = disconnect_listener(scope)
        if on_disconnect is not None:
            on_disconnect(self.fire)
            return
        # The task's own loop: asyncio's get_running_loop() costs a system call (getpid).
        self.watcher = self.task.get_loop().create_task(self.run(receive))

    def stop(self) -> None:
        """The request is answered, or being refused: its client leaving cancels nothing
        from now on."""
        self.done = True
        if self.watcher is not None:
            self.watcher.cancel()

    def left(self) -> bool:
        """Whether the request's task was cancelled because its client left, and for no
        other reason (the gateway stopping); if so the cancellation is taken back, so that
        the request ends quietly (499)."""
        return self.fired and self.task.uncancel() == 0

    def fire(self) -> None:
        """The client is gone: cancel the request, unless its answer is done."""
        # After the answer's last byte, ``receive`` says http.disconnect too: not a cancel.
        if not self.done:
            self.fired = True
            self.task.cancel()

    async def run(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fire()


class CompletionExchange:
    """One completion request: what it asked, where it went, and what its log line says."""

    __slots__ = (
        "added_s",
        "body",
        "ended_at",
        "first_byte_at",
        "key",
        "model",
        "note",
        "quota_headers",
        "replica",
        "request_id",
        "reserved_tokens",
        "route_header",
        "route_key",
        "status",
        "stream",
        "timing",
        "token_estimate",
    )

    def __init__(self, started: float) -> None:
        self.timing = Timing(started)
        self.request_id = request_id()
        self.key: KeyRecord | None = None
        self.body = b""
        self.model = ""
        self.stream = False
        self.replica = ""
        self.route_key: RouteKey | None = None
        self.route_header: bytes | None = None
        """``x-llmgw-route`` of the answer, once a replica took it; ``None`` unless the
        client asked for it."""
        self.status = 500
        self.note: str | None = None
        self.quota_headers: tuple[Header, ...] = ()
        self.token_estimate = 1
        """What a tpm limit reserves at admission: prompt and the most it may generate."""
        self.reserved_tokens = 0
        self.first_byte_at: float | None = None
        self.ended_at: float | None = None
        """When the engine's answer was all read (a stream's last chunk relayed)."""
        self.added_s: float | None = None
        """Fixed when the answer starts; until then, ``timing`` says."""

    @property
    def answer_started(self) -> bool:
        return self.added_s is not None

    def answer_headers(self) -> list[Header]:
        """The gateway's headers of an answer that starts now."""
        self.added_s = self.timing.added_s(clock())
        return [
            (b"x-request-id", self.request_id),
            (b"x-llmgw-gateway-ms", b"%.3f" % (self.added_s * 1000)),
            *self.quota_headers,
            *(() if self.route_header is None else ((ROUTE_HEADER, self.route_header),)),
        ]


class Completions:
    """Serves completion requests; ``upstream`` is set once the application has started."""

    def __init__(
        self,
        *,
        snapshot: Callable[[], GatewaySnapshot],
        metrics: GatewayMetrics,
        limiter: Limiter,
        keys: KeyCheck,
        log_requests: bool = True,
        traffic: TrafficWindow | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._metrics = metrics
        self._limiter = limiter
        self._keys = keys
        self._log_requests = log_requests
        self._traffic = traffic or TrafficWindow()
        self.upstream: Upstream | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop requests are served on, set with ``upstream``: asking it for the
        current task costs no system call (asyncio's own look-up asks for the process id)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = CompletionExchange(clock())
        # Every line logged while serving the request carries its id, as its answer does.
        # Bound and reset by token: ``bound_contextvars`` would also read the whole context
        # first, to restore an outer value that a request's own task never has.
        tokens = structlog.contextvars.bind_contextvars(request_id=exchange.request_id.decode())
        try:
            await self._serve(exchange, scope, receive, send)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)

    async def _serve(
        self, exchange: CompletionExchange, scope: Scope, receive: Receive, send: Send
    ) -> None:
        task = asyncio.current_task(self.loop)
        assert task is not None
        watch = DisconnectWatch(task)
        try:
            snapshot = self._snapshot()
            authorization, session, show_route, length = _request_headers(scope)
            key = exchange.key = self._keys.check(snapshot, authorization, scope)
            if length is not None and announces_more_than(length, MAX_BODY_BYTES):
                # Before the body is asked for: a client that waits for 100 Continue to
                # send it gets none, and the body is never read.
                raise body_too_large(MAX_BODY_BYTES)
            exchange.body = await _read_body(receive)
            fields = _parse(exchange.body)
            model = fields.model
            path: str = scope["path"]
            endpoint = JSON_ENDPOINTS[path]
            self._check_model(snapshot, key, model, endpoint.api, path)
            exchange.model = model
            exchange.stream = bool(fields.stream)
            if key.tpm is not None:
                exchange.token_estimate = _token_estimate(
                    fields, len(exchange.body), generates=endpoint.generates
                )
            exchange.route_key = route_key(snapshot.policy_of(model), exchange.body, session)
            if show_route:
                exchange.route_header = b""
            # Watched from before admission: a client that leaves while its request waits
            # for a grant of its key's limits is neither charged nor forwarded.
            watch.start(scope, receive)
            await self._admit(exchange, key)
            await self._forward(exchange, key, endpoint.engine_path, watch, send)
        except ApiError as error:
            watch.stop()
            exchange.status = error.status
            await refuse(send, error, exchange.answer_headers())
        except ClientGoneBeforeBody:
            exchange.status = CLIENT_GONE
        except asyncio.CancelledError:
            if not watch.left():
                raise
            exchange.status = CLIENT_GONE
        except Exception:
            # A bug, not a client's or an engine's doing: logged with its traceback, and
            # answered in OpenAI's shape if the answer has not started yet.
            watch.stop()
            log.exception("gateway_request_failed")
            exchange.status = 500
            if not exchange.answer_started:
                await refuse(send, internal_error(), exchange.answer_headers())
        finally:
            watch.stop()
            self._finish(exchange)

    def _check_model(
        self, snapshot: GatewaySnapshot, key: KeyRecord, model: str, api: str, path: str
    ) -> None:
        """404 unless ``model`` is declared, the key may use it and it serves ``api``."""
        if model not in snapshot.declared or not key.allows(model):
            raise model_not_found(model)
        if not snapshot.serves(model, api):
            raise api_not_served(model, api, path)

    async def _admit(self, exchange: CompletionExchange, key: KeyRecord) -> None:
        """The key's rate limits: 429 when it is over one. A request that waits for a
        grant on its way takes nothing until it is admitted: cancelled meanwhile (its
        client left), it is charged nothing."""
        deadline = time.monotonic() + GRANT_WAIT_S
        while True:
            now = time.monotonic()
            decision = self._limiter.admit(
                key.key_id, rpm=key.rpm, tpm=key.tpm, now=now, tokens=exchange.token_estimate
            )
            if not decision.pending or now >= deadline:
                break
            # A burst faster than the slices grow: the grant asked for is on its way.
            await self._limiter.answered(deadline - now)
        if not decision.allowed:
            self._metrics.rejected(quota_reason(decision))
            raise quota_exceeded(decision)
        if decision is not ALLOWED_UNLIMITED:
            exchange.quota_headers = rate_limit_headers(decision)
        exchange.reserved_tokens = decision.reserved_tokens

    async def _forward(
        self,
        exchange: CompletionExchange,
        key: KeyRecord,
        path: str,
        watch: DisconnectWatch,
        send: Send,
    ) -> None:
        await self._relay_answer(
            exchange,
            key,
            send,
            watch,
            lambda: self._open(exchange, key, path),
            lambda opened: exchange.stream and opened.answer.status == 200,
        )

    async def _relay_answer(
        self,
        exchange: CompletionExchange,
        key: KeyRecord,
        send: Send,
        watch: DisconnectWatch,
        open_upstream: Callable[[], Awaitable[Opened]],
        streamed: Callable[[Opened], bool],
    ) -> None:
        """Open the engine's answer and relay it to the client: as it comes when
        ``streamed`` says so, else whole; tokens spent and the attempt counted, also when
        the client went away (``watch`` cancels the task: the caller ends it quietly)."""
        opened: Opened | None = None
        tokens: StreamTokens | None = None
        outcome: Outcome | None = None
        try:
            opened = await open_upstream()
            exchange.replica = opened.lease.route.replica_id
            if exchange.route_header is not None:
                exchange.route_header = route_header(opened.lease, exchange.route_key)
            if streamed(opened):
                exchange.stream = True
                tokens = StreamTokens()
                exchange.status = 200

                def first_chunk() -> None:
                    exchange.first_byte_at = clock()

                finished = await relay_stream(
                    opened, send, exchange.answer_headers(), tokens, first_chunk
                )
                exchange.ended_at = clock()
                outcome = Outcome.ANSWERED if finished else Outcome.FAILED
                watch.done = True
                if key.tpm is not None:
                    self._spend(key, tokens.total())
                if not finished:
                    exchange.note = "the engine stopped mid-stream"
                return
            try:
                status, content_type, body = await read_whole(opened, exchange.timing)
            except ApiError:
                outcome = Outcome.FAILED  # the answer broke off
                raise
            exchange.first_byte_at = exchange.ended_at = clock()
            outcome = outcome_of_status(status)
            exchange.status = status
            watch.done = True
            if key.tpm is not None and status < 400:
                self._spend(key, self._tokens_of(exchange, key.tpm, body))
            headers = exchange.answer_headers()
            headers.append((b"content-type", content_type))
            headers.append((b"content-length", b"%d" % len(body)))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        except asyncio.CancelledError:
            if outcome is None:
                # The client left before any of the answer came, as clients of a replica that
                # hangs do: a rollout's verdict counts that against the replica.
                started = exchange.first_byte_at is not None
                outcome = Outcome.CANCELLED if started else Outcome.ABANDONED
                if tokens is not None and key.tpm is not None:
                    # Cut short mid-stream: what was sent was generated for the client, and
                    # is charged (one token per event; the usage chunk never came), or a
                    # client could read all of every answer but its end for nothing.
                    self._spend(key, tokens.total())
            raise
        finally:
            if opened is not None:
                opened.close()
                self._count(exchange, opened, outcome, tokens)
                if tokens is not None and tokens.unusable:
                    self._usage_unusable(exchange)

    def _count(
        self,
        exchange: CompletionExchange,
        opened: Opened,
        outcome: Outcome | None,
        tokens: StreamTokens | None,
    ) -> None:
        """Count the answer against its replica. ``tokens`` is set for a streamed 2xx."""
        if outcome is None:
            return  # a bug of the gateway's own (logged as one), not the replica's doing
        sent_at = opened.sent_at
        first_at = exchange.first_byte_at if tokens is not None else None
        ended_at = exchange.ended_at
        ttft_s = None if first_at is None else first_at - sent_at
        latency_s = tpot_s = None
        if outcome is Outcome.ANSWERED and ended_at is not None and opened.answer.status < 300:
            latency_s = ended_at - sent_at
            if tokens is not None and first_at is not None:
                output_tokens = tokens.output_tokens()
                if output_tokens >= 2:
                    tpot_s = (ended_at - first_at) / (output_tokens - 1)
        self._traffic.record(
            opened.lease.route.replica_id,
            outcome,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            latency_s=latency_s,
        )

    async def _open(self, exchange: CompletionExchange, key: KeyRecord, path: str) -> Opened:
        if self.upstream is None:
            raise RuntimeError("requests are served only between lifespan startup and shutdown")
        model = exchange.model
        try:
            return await self.upstream.open(
                model,
                key.key_id,
                path,
                exchange.body,
                exchange.request_id.decode(),
                exchange.timing,
                exchange.route_key,
            )
        except RouteRefused as exc:
            raise self._refused(model, exc) from None

    def _refused(self, model: str, refusal: RouteRefused) -> ApiError:
        """The answer to a request the router found no replica for, counted by reason."""
        match refusal:
            case ModelRemoved():
                # Held while the model was removed: the answer a retry would get, not a
                # 503 that tells the client to retry.
                reason, error = "model_removed", model_not_found(model)
            case NoServingReplica():
                reason, error = "no_serving_replica", no_serving_replica(model)
            case Saturated(retry_after_s=retry_after_s, starting=starting):
                reason, error = "saturated", saturated(model, retry_after_s, starting=starting)
            case ColdStartTimedOut(timeout_s=timeout_s, retry_after_s=retry_after_s):
                reason = "cold_start_timeout"
                error = cold_start_timed_out(model, timeout_s, retry_after_s)
            case GatewayStopping():
                reason, error = "gateway_stopping", gateway_stopping(model)
            case _:
                raise TypeError(f"unknown refusal {refusal!r}")
        self._metrics.rejected(reason)
        return error

    def _spend(self, key: KeyRecord, tokens: int) -> None:
        self._limiter.record_tokens(key.key_id, tokens, now=time.monotonic())

    def _tokens_of(self, exchange: CompletionExchange, tpm: int, body: bytes) -> int:
        """What a whole answer is charged: its usage's total, or, when the engine's figures
        are unusable, what the request reserved at admission, its estimate up to the key's
        ``tpm`` (``app.gateway.usage``)."""
        used = usage_of_body(body)
        if used is None:
            self._usage_unusable(exchange)
            return min(exchange.token_estimate, tpm)
        return used

    def _usage_unusable(self, exchange: CompletionExchange) -> None:
        if exchange.note is None:
            exchange.note = "the engine's usage figures were unusable"
        self._metrics.usage_unusable(exchange.model)

    def _finish(self, exchange: CompletionExchange) -> None:
        if exchange.reserved_tokens and exchange.key is not None:
            # What the answer used was charged by ``_spend``: the reservation goes back.
            self._limiter.record_tokens(
                exchange.key.key_id, 0, now=time.monotonic(), reserved=exchange.reserved_tokens
            )
        now = clock()
        timing = exchange.timing
        added_s = timing.added_s(now) if exchange.added_s is None else exchange.added_s
        first_byte_at = exchange.first_byte_at
        self._metrics.answered(
            exchange.model,
            exchange.status,
            duration_s=now - timing.started,
            added_s=added_s,
            first_byte_s=None if first_byte_at is None else first_byte_at - timing.started,
            queue_s=timing.queue_s if exchange.replica else None,
        )
        if not self._log_requests:
            return
        # Debug unless it failed, or the gateway's own share (the queue) was slow: the
        # engine's generation time is the engine's.
        level = request_level(exchange.status, added_s)
        # Asked first: a line below the configured level is not built at all.
        if log.is_enabled_for(level):
            log.log(
                level,
                "gateway_request",
                key=exchange.key.prefix if exchange.key is not None else None,
                model=exchange.model,
                replica_id=exchange.replica,
                status=exchange.status,
                stream=exchange.stream,
                added_ms=round(added_s * 1000, 3),
                ms=round((now - timing.started) * 1000, 3),
                note=exchange.note,
            )


BYTES_PER_TOKEN = 4
"""For the estimate of a prompt's tokens from its body: about four bytes of English each."""
DEFAULT_OUTPUT_TOKENS = 256
"""Reserved for the answer of a request that says no maximum."""


def _token_estimate(fields: RoutingFields, body_bytes: int, *, generates: bool) -> int:
    """The tokens a tpm limit reserves for a request until its usage is known: its input,
    and, for an API that ``generates``, the most it may generate."""
    if not generates:
        return body_bytes // BYTES_PER_TOKEN  # an embedding, a score: input tokens alone
    output = DEFAULT_OUTPUT_TOKENS
    for raw in (fields.max_completion_tokens, fields.max_tokens, fields.max_output_tokens):
        if raw is _ABSENT:
            continue  # left out: an exception per absent field would cost more than the rest
        try:
            output = _decode_count(raw)
            break
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # absent, null or not a count: the engine says what is wrong with it
    return body_bytes // BYTES_PER_TOKEN + output


def _request_headers(scope: Scope) -> tuple[bytes | None, bytes | None, bool, bytes | None]:
    """The request's ``Authorization`` (400 when it comes more than once:
    ``app.gateway.asgi.authorization_of``), its session id (``x-session-id``), whether it
    asks for the route (``x-llmgw-route`` set to anything but ``0``), and its
    ``Content-Length``: one walk of the headers for all four."""
    authorization: bytes | None = None
    session: bytes | None = None
    show = False
    length: bytes | None = None
    for name, value in scope["headers"]:
        if name == AUTHORIZATION:
            if authorization is not None:
                raise repeated_authorization()
            authorization = value
        elif name == SESSION_HEADER:
            session = value or None
        elif name == ROUTE_HEADER:
            show = value.strip() not in (b"", b"0")
        elif name == b"content-length":
            length = value
    return authorization, session, show, length


def route_header(lease: Lease, key: RouteKey | None) -> bytes:
    """``replica=<id>; policy=<policy>; reason=<reason>; key=<prefix|session|none>``."""
    return (
        f"replica={lease.route.replica_id}; policy={lease.policy}; reason={lease.reason}; "
        f"key={'none' if key is None else key.kind}"
    ).encode()


def _parse(body: bytes) -> RoutingFields:
    try:
        return _decode_fields(body)
    except msgspec.ValidationError as exc:
        raise invalid_request(f"Invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        if not body.strip():
            # msgspec would say "truncated", as if the client had cut its body short.
            raise invalid_request(
                "The request body is empty: send a JSON object with `model`."
            ) from None
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        # Catching the decoder's own limit costs nothing on the requests that stay under it;
        # a scan for depth beforehand would cost every request a second pass over its body.
        raise invalid_request(
            "The request body nests arrays and objects too deeply for the gateway to read "
            "(about 1,000 levels); no OpenAI request comes close."
        ) from None


async def _read_body(receive: Receive) -> bytes:
    """The request's body, without the byte order mark it may start with
    (``app.listeners.bom``): the engine gets the JSON alone."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGoneBeforeBody
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return without_mark(body)
    mark = LeadingMark()
    chunks = [mark.feed(body, more=True)]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGoneBeforeBody
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise body_too_large(MAX_BODY_BYTES)
        more = message.get("more_body", False)
        chunks.append(mark.feed(chunk, more=more))
        if not more:
            return b"".join(chunks)
