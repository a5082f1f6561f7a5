"""Calling an engine replica: choosing one, the one retry, and relaying its answer.

``Upstream.open`` asks the router for a replica and sends the client's body to it byte for
byte. A connection failure, or an engine answering 503 (starting, overloaded), before
anything of the answer arrived is retried once on another replica: nothing has reached the
client yet, so the retry is invisible to it. Past that point the answer is the client's,
errors included.

Relaying: a whole answer is read and sent on (an error body in OpenAI's shape); a stream's
server-sent events go to the client as they arrive, unparsed (but for an engine's error
event, put in OpenAI's shape: only pieces holding ``"error"`` are looked into), ending with
the engine's own ``data: [DONE]``. If the engine dies mid-stream the client gets an error event and
``data: [DONE]`` instead of a stream that just stops; an event the engine had sent only
part of is not relayed (``app.gateway.sse``), so the error event is one of its own. A
stream still open when the gateway's graceful shutdown ends is cancelled, and ends the
same way, with an error event saying so.

Cancellation is the caller's: cancelling the task that awaits any of these and then
closing the answer (``Opened.close``) closes the upstream connection, which is how an
engine learns that its client went away.

An engine that does not answer within the head bound (``EngineTimeouts``) gets 504; its
attempt counts as the replica's failure but is not retried: the engine has the request,
and the client has waited the whole bound already. One that goes silent past its bound
after its answer's head ends the answer as a broken one does (504 for an answer read
whole, which the client has not been sent anything of). Each is logged once, with the
replica and the bound.

Each attempt tells its lease how the replica did up to the first byte of its answer's body
(an answer read whole, its end), or a stream up to its end, which is what ejects a replica
that keeps failing from this gateway's rotation (``app.gateway.ejection``): a failure is no
answer, a 5xx head, or a head below 500 whose body then broke off or stalled before then.
An engine sends a stream's head before it has generated anything, so a wedged one answers
``200`` to every stream and then nothing, and one that wedges mid-stream stalls every
stream it holds: that is its failure, not a success. A cancel tells nothing.

Each attempt that ends here (no answer, a retried 503, a cancel before the answer's head)
is counted against its replica in the gateway's ``TrafficWindow``; an answer handed to
the caller is the caller's to count, with ``Opened.sent_at`` as its start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

import structlog

from app.domain.traffic import Outcome
from app.gateway.affinity import RouteKey
from app.gateway.asgi import Header, Send
from app.gateway.engine_answer import EngineAnswer
from app.gateway.engine_client import EngineClient
from app.gateway.engine_error_body import (
    ERROR_MARK,
    engine_error,
    normalize_engine_error,
    stream_errors,
)
from app.gateway.engine_errors import (
    AnswerBroken,
    AnswerStalled,
    AnswerTooLarge,
    EngineUnreachable,
    HeadRefused,
    HeadTimedOut,
)
from app.gateway.errors import (
    STOPPED_MID_STREAM,
    ApiError,
    stream_error_events,
    upstream_disconnected,
    upstream_invalid_answer,
    upstream_timeout,
    upstream_unreachable,
)
from app.gateway.lease import Lease
from app.gateway.route_refusals import NoServingReplica
from app.gateway.router import Router
from app.gateway.sse import WholeEvents
from app.gateway.traffic import TrafficWindow
from app.gateway.usage import StreamTokens

RETRYABLE_STATUS = 503
FAILED_STATUS = 500
"""An answer head from this status up counts against the replica's health."""

_clock = time.perf_counter

log = structlog.get_logger("llmgw.gateway")


class Timing:
    """Where a request's time went: ``upstream_s`` is time spent waiting on engines."""

    __slots__ = ("queue_s", "started", "upstream_s")

    def __init__(self, started: float) -> None:
        self.started = started
        self.upstream_s = 0.0
        self.queue_s = 0.0

    def added_s(self, now: float) -> float:
        """Time the gateway itself added so far: everything but the engines' time."""
        return now - self.started - self.upstream_s


class EngineRefusal(ApiError):
    """An engine's error answer, already in OpenAI's shape, kept to be sent on."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(status, f"the engine answered HTTP {status}")
        self._body = body

    def body(self) -> bytes:
        return self._body


class Opened:
    """A replica's answer whose head has arrived, and the lease that holds the replica."""

    __slots__ = ("answer", "lease", "sent_at")

    def __init__(self, lease: Lease, answer: EngineAnswer, sent_at: float) -> None:
        self.lease = lease
        self.answer = answer
        self.sent_at = sent_at
        """When the request was sent to the engine (``time.perf_counter``)."""

    def close(self) -> None:
        """The request is over: an unfinished answer's connection is closed."""
        self.answer.close()
        self.lease.release()


class Upstream:
    def __init__(
        self,
        router: Router,
        client: EngineClient,
        on_retry: Callable[[str], None] = lambda reason: None,
        traffic: TrafficWindow | None = None,
    ) -> None:
        self._router = router
        self._client = client
        self._on_retry = on_retry
        self._traffic = traffic or TrafficWindow()

    async def open(
        self,
        model: str,
        key_id: str,
        path: str,
        body: bytes,
        request_id: str,
        timing: Timing,
        route_key: RouteKey | None = None,
    ) -> Opened:
        """Send ``body`` to a replica of ``model``; retried once before the first byte.
        ``route_key``: the request's key under the model's routing policy. Raises
        ``NoServingReplica``, ``Saturated``, ``ColdStartTimedOut`` (from the router) or
        ``ApiError``."""
        exclude: frozenset[str] = frozenset()
        failure: ApiError | None = None
        for attempt in (1, 2):
            queued = _clock()
            try:
                lease = await self._router.acquire(model, key_id, exclude, route_key)
            except NoServingReplica:
                if failure is None:
                    raise
                # The only replicas left are the ones that just failed: say why they did.
                raise failure from None
            finally:
                timing.queue_s += _clock() - queued
            sent = _clock()
            try:
                answer = await self._client.post(lease.route.url, path, body, request_id)
            except EngineUnreachable as exc:
                reason, failure = _unreachable(model, exc)
                lease.failed(reason)
                lease.release()
                self._traffic.record(lease.route.replica_id, Outcome.FAILED)
            except BaseException as exc:
                self._headless(lease, timing, sent, exc)
                raise
            else:
                if answer.status >= FAILED_STATUS:
                    lease.failed(f"HTTP {answer.status}")
                if answer.status != RETRYABLE_STATUS or attempt == 2:
                    timing.upstream_s += _clock() - sent
                    return Opened(lease, answer, sent)
                self._traffic.record(lease.route.replica_id, Outcome.FAILED)
                try:
                    refused = await answer.read()
                except AnswerBroken:
                    refused = b""
                finally:
                    answer.close()
                    lease.release()
                failure = EngineRefusal(
                    RETRYABLE_STATUS, normalize_engine_error(RETRYABLE_STATUS, refused)
                )
                reason = "unavailable"
            timing.upstream_s += _clock() - sent
            if attempt == 1:
                self._on_retry(reason)
            exclude = exclude | {lease.route.replica_id}
        assert failure is not None
        raise failure

    async def open_upload(
        self,
        model: str,
        key_id: str,
        path: str,
        upload: Upload,
        request_id: str,
        timing: Timing,
    ) -> Opened:
        """Send an upload to a replica of ``model`` as the client sends it. It is retried
        on another replica only if the first could not be connected to: once some of the
        body has gone, it cannot be sent again. Raises as ``open`` does, and whatever
        reading the upload raises."""
        exclude: frozenset[str] = frozenset()
        failure: ApiError | None = None
        for attempt in (1, 2):
            queued = _clock()
            try:
                lease = await self._router.acquire(model, key_id, exclude)
            except NoServingReplica:
                if failure is None:
                    raise
                raise failure from None  # the only replicas left are the ones that failed
            finally:
                timing.queue_s += _clock() - queued
            sent = _clock()
            try:
                answer = await self._client.upload(
                    lease.route.url,
                    path,
                    upload.content_type,
                    upload.content_length,
                    upload.body(),
                    request_id,
                )
            except EngineUnreachable as exc:
                reason, failure = _unreachable(model, exc)
                lease.failed(reason)
                lease.release()
                self._traffic.record(lease.route.replica_id, Outcome.FAILED)
                timing.upstream_s += _clock() - sent
                if attempt == 2 or upload.started:
                    raise failure from None
                self._on_retry(reason)
                exclude = exclude | {lease.route.replica_id}
                continue
            except BaseException as exc:
                self._headless(lease, timing, sent, exc)
                raise
            if answer.status >= FAILED_STATUS:
                lease.failed(f"HTTP {answer.status}")
            timing.upstream_s += _clock() - sent
            return Opened(lease, answer, sent)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _headless(self, lease: Lease, timing: Timing, sent: float, exc: BaseException) -> None:
        """An attempt on ``lease`` sent at ``sent`` ended without a head, by ``exc``, other
        than by an engine that could not be reached (each caller's to retry or not): the
        lease is released, a cancel counted as abandoned, and a head that never came raised
        as the replica's failure (504); the caller raises anything else again. Called
        from the ``except`` of both ``open`` and ``open_upload``, not around their awaits:
        an attempt that gets its head, nearly every one, costs no coroutine more."""
        if isinstance(exc, HeadTimedOut):
            timing.upstream_s += _clock() - sent
            raise self._timed_out(lease, exc) from None
        lease.release()
        if isinstance(exc, asyncio.CancelledError):
            self._traffic.record(lease.route.replica_id, Outcome.ABANDONED)

    def _timed_out(self, lease: Lease, exc: HeadTimedOut) -> ApiError:
        """An attempt whose head never came: a failure of the replica, not retried."""
        lease.failed("timeout")
        lease.release()
        self._traffic.record(lease.route.replica_id, Outcome.FAILED)
        _log_timeout(lease, exc.bound, exc.timeout_s)
        return upstream_timeout(lease.route.model, str(exc))


def _log_timeout(lease: Lease, bound: str, timeout_s: float) -> None:
    log.warning(
        "engine_timed_out",
        detail="the engine sent nothing within its bound; its connection was closed",
        replica_id=lease.route.replica_id,
        model=lease.route.model,
        bound=bound,
        timeout_s=timeout_s,
    )


def _unreachable(model: str, exc: EngineUnreachable) -> tuple[str, ApiError]:
    """Why an attempt got no answer to relay (a retry's reason), and what the client is
    told of it."""
    if isinstance(exc, HeadRefused):
        return "invalid_answer", upstream_invalid_answer(model, str(exc))
    return "unreachable", upstream_unreachable(model, str(exc))


class Upload(Protocol):
    """A request body read from the client while it is sent on (``app.gateway.uploads``)."""

    content_type: bytes
    content_length: int | None

    @property
    def started(self) -> bool:
        """Whether ``body()`` has handed over anything yet."""
        ...

    def body(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes, in order, from the first."""
        ...


async def read_whole(opened: Opened, timing: Timing) -> tuple[int, bytes, bytes, str | None]:
    """The whole answer: status, content type (empty where the engine sent none) and body
    (errors in OpenAI's shape), and what of an error's type and code the client does not
    get (``EngineError.unrelayed``)."""
    answer = opened.answer
    opened.lease.first_byte()
    started = _clock()
    try:
        body = await answer.read()
    except AnswerBroken as exc:
        opened.lease.failed(_broken_reason(exc))
        if isinstance(exc, AnswerStalled):
            _log_timeout(opened.lease, exc.bound, exc.timeout_s)
            raise upstream_timeout(opened.lease.route.model, str(exc)) from exc
        if isinstance(exc, AnswerTooLarge):
            raise upstream_invalid_answer(opened.lease.route.model, str(exc)) from exc
        raise upstream_disconnected(opened.lease.route.model, str(exc)) from exc
    finally:
        timing.upstream_s += _clock() - started
    opened.lease.succeeded()
    status = answer.status
    if status >= 400:
        error = engine_error(status, body)
        return status, b"application/json", error.body, error.unrelayed
    return status, answer.content_type, body, None


class StreamEnd:
    """How an engine's stream ended: ``cut`` when before its end (``StreamCut``), and
    ``error_status``, the highest status its error events named, when it sent any."""

    __slots__ = ("cut", "error_status")

    def __init__(self, cut: StreamCut | None, error_status: int | None) -> None:
        self.cut = cut
        self.error_status = error_status


class StreamCut:
    """Why an engine's stream ended before its end: ``reason`` as a replica's failure is
    counted (``broken``, ``timeout``, ``invalid_answer``), ``detail`` in words."""

    __slots__ = ("detail", "reason")

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail


async def relay_stream(
    opened: Opened,
    send: Send,
    headers: list[Header],
    tokens: StreamTokens | None,
    on_first_chunk: Callable[[], None],
    on_engine_error: Callable[[str], None] = lambda unrelayed: None,
) -> StreamEnd:
    """Pass the engine's stream to the client as it comes; ``headers`` start the answer.
    Its end says why the engine did not finish it, if it did not (the client got an error
    event). An error event of the engine's goes in OpenAI's shape (``stream_errors``),
    and what of its type and code the client does not get to
    ``on_engine_error``; one of a 5xx counts against the replica as a 5xx answer does."""
    answer = opened.answer
    headers.append((b"content-type", answer.content_type or b"text/event-stream"))
    headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    events = WholeEvents()
    first = True
    more = True
    error_status: int | None = None
    try:
        async for chunk in answer.chunks():
            # A chunk with the engine's answer all read ends the client's answer too: its
            # last chunk leaves with it, in one write.
            more = not answer.ended
            # Whole events only, so that an engine dying mid-event leaves none half sent.
            body = events.cut(chunk) if more else events.rest(chunk)
            if ERROR_MARK in body:  # checked here: a call less for every other piece
                body, error_status = _errors_normalized(body, on_engine_error, error_status)
            if first:
                first = False
                on_first_chunk()
                # Relayed before the bookkeeping, which the client need not wait for.
                if body or not more:
                    await send({"type": "http.response.body", "body": body, "more_body": more})
                opened.lease.first_byte()
            elif body or not more:
                await send({"type": "http.response.body", "body": body, "more_body": more})
            if tokens is not None:
                tokens.feed(chunk)
    except asyncio.CancelledError:
        # The client left (nothing reaches it: this sends nothing) or the gateway stops
        # past its grace: its client is told so, rather than seeing the stream just stop.
        events.drop()
        await send({"type": "http.response.body", "body": STOPPED_MID_STREAM})
        raise
    except AnswerBroken as exc:
        # Before its first piece or after it: an engine that wedges mid-stream (its GPU
        # hung, its scheduler deadlocked) stalls every stream it holds, and is ejected for
        # it, rather than only once new ones wait out the head bound in their turn.
        reason = _broken_reason(exc)
        opened.lease.failed(reason)
        if isinstance(exc, AnswerStalled):
            _log_timeout(opened.lease, exc.bound, exc.timeout_s)
        events.drop()
        message = f"The engine stopped answering mid-stream: {exc}"
        await send({"type": "http.response.body", "body": stream_error_events(message)})
        return StreamEnd(StreamCut(reason, str(exc)), error_status)
    rest = b""
    if more:
        rest, error_status = _errors_normalized(events.rest(), on_engine_error, error_status)
    # A stream's verdict is how it ends: one that ended properly, with pieces or none, but
    # not one whose engine said it failed: an engine that answers every stream with a 5xx
    # error event is as unhealthy as one answering 500s.
    if error_status is not None and error_status >= 500:
        opened.lease.failed(f"HTTP {error_status} error event")
    else:
        opened.lease.succeeded()
    if more:
        await send({"type": "http.response.body", "body": rest})
    return StreamEnd(None, error_status)


def _errors_normalized(
    body: bytes, on_engine_error: Callable[[str], None], worst: int | None
) -> tuple[bytes, int | None]:
    """Whole events of a stream, an engine's error events among them in OpenAI's shape;
    and the highest status of theirs and ``worst``."""
    if ERROR_MARK not in body:
        return body, worst
    errors = stream_errors(body)
    if errors.unrelayed is not None:
        on_engine_error(errors.unrelayed)
    if errors.status is None:
        return errors.events, worst
    return errors.events, errors.status if worst is None else max(worst, errors.status)


def _broken_reason(exc: AnswerBroken) -> str:
    """Why an answer that broke off before its first byte counts against its replica."""
    if isinstance(exc, AnswerStalled):
        return "timeout"
    if isinstance(exc, AnswerTooLarge):
        return "invalid_answer"
    return "broken"
