"""What serving every request passed to an engine takes, whatever its body
(``ExchangeSteps``): the model check, the key's rate limits, the engine's answer relayed
and counted, the answer to a request the router found no replica for, and the accounting
and log line at its end. The routes that read a request (``app.gateway.completions`` for a
JSON body, ``app.gateway.uploads`` for a multipart upload) share one of them.

How each answer ended is counted against its replica in the gateway's ``TrafficWindow``
(``_count``): answered, failed (a 5xx or 429, or an answer that broke off) or cancelled by
the client (abandoned when none of the answer had come), with the times measured from
sending the request to the engine. For a stream, TTFT is the first chunk of its body and
TPOT the time from there to its end per output token after the first; the latency of a 2xx
answer is to its last byte. What is measured and why is in docs/gateway.md.

A stream cut off after its 200 head went out (its engine broke off, or the gateway's
shutdown grace ran out) is logged at warning (``stream_cut_off``, with the model, the
replica and why) and counted by reason on ``/metrics``: its request line reads as a 200.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import structlog

from app.domain.failure_count import failures_told
from app.domain.traffic import Outcome, outcome_of_status
from app.gateway.asgi import KeyCheck, Send, clock
from app.gateway.disconnect import DisconnectWatch
from app.gateway.errors import (
    ApiError,
    api_not_served,
    cold_start_timed_out,
    failing_to_start,
    gateway_stopping,
    model_not_found,
    no_serving_replica,
    quota_exceeded,
    quota_reason,
    rate_limit_headers,
    replicas_starting,
    saturated,
)
from app.gateway.exchange import CompletionExchange, route_header
from app.gateway.metrics import GatewayMetrics
from app.gateway.proxy import Opened, Upstream, read_whole, relay_stream
from app.gateway.ratelimit import ALLOWED_UNLIMITED, Limiter
from app.gateway.route_refusals import (
    ColdStartTimedOut,
    FailingToStart,
    GatewayStopping,
    ModelRemoved,
    NoServingReplica,
    RouteRefused,
    Saturated,
)
from app.gateway.table import GatewaySnapshot, KeyRecord
from app.gateway.traffic import TrafficWindow
from app.gateway.usage import StreamTokens, usage_of_body
from app.listeners.http11 import BODILESS_STATUSES
from app.logs import request_level

GRANT_WAIT_S = 0.25
"""How long a request that finds its key's slices spent waits for the grant on its way
before it is refused (``app.gateway.sharedlimits``)."""

log = structlog.get_logger("llmgw.gateway")
STREAM_STOPPED_DETAIL = "the stream was still open when the gateway's shutdown grace ran out"


class ExchangeSteps:
    """The steps a request passed to an engine goes through, with what they share:
    ``upstream`` (the replicas' client) and ``loop`` are set once the application has
    started."""

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
        self.snapshot = snapshot
        """The routing table and keys to serve by, now."""
        self.keys = keys
        self._metrics = metrics
        self._limiter = limiter
        self._log_requests = log_requests
        self._traffic = traffic or TrafficWindow()
        self.upstream: Upstream | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop requests are served on, set with ``upstream``: asking it for the
        current task costs no system call (asyncio's own look-up asks for the process id)."""

    def started_upstream(self) -> Upstream:
        """The replicas' client, which exists only between the application's lifespan
        startup and shutdown."""
        if self.upstream is None:
            raise RuntimeError("requests are served only between lifespan startup and shutdown")
        return self.upstream

    @staticmethod
    def check_model(
        snapshot: GatewaySnapshot, key: KeyRecord, model: str, api: str, path: str
    ) -> None:
        """404 unless ``model`` is declared, the key may use it and it serves ``api``."""
        if model not in snapshot.declared or not key.allows(model):
            raise model_not_found(model)
        if not snapshot.serves(model, api):
            raise api_not_served(model, api, path)

    async def admit(self, exchange: CompletionExchange, key: KeyRecord) -> None:
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

    async def relay(
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
        error_event_status: int | None = None
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

                def engine_error(unrelayed: str) -> None:
                    exchange.note = f"the engine's error said {unrelayed}"

                end = await relay_stream(
                    opened, send, exchange.answer_headers(), tokens, first_chunk, engine_error
                )
                exchange.ended_at = clock()
                cut, error_event_status = end.cut, end.error_status
                if cut is not None:
                    outcome = Outcome.FAILED
                elif end.error_status is not None:
                    # The engine's error event, counted as the same answer whole would be.
                    outcome = outcome_of_status(end.error_status)
                else:
                    outcome = Outcome.ANSWERED
                watch.done = True
                if key.tpm is not None:
                    self._spend(key, tokens.total())
                if cut is not None:
                    exchange.note = "the engine stopped mid-stream"
                    self._stream_cut(exchange, cut.reason, cut.detail)
                return
            try:
                status, content_type, body, unrelayed = await read_whole(opened, exchange.timing)
            except ApiError:
                outcome = Outcome.FAILED  # the answer broke off
                raise
            exchange.first_byte_at = exchange.ended_at = clock()
            if unrelayed is not None:
                exchange.note = f"the engine's error said {unrelayed}"
            outcome = outcome_of_status(status)
            exchange.status = status
            watch.done = True
            if key.tpm is not None and status < 400:
                self._spend(key, self._tokens_of(exchange, key.tpm, body))
            headers = exchange.answer_headers()
            if status not in BODILESS_STATUSES:
                # An engine's body without a type is taken as the API's JSON.
                headers.append((b"content-type", content_type or b"application/json"))
                # RFC 9110 (8.6): a 204 carries no length, and a 304's would be that of a
                # 200 the gateway never saw; the client knows either has no body.
                headers.append((b"content-length", b"%d" % len(body)))
            elif content_type:
                # No body to type: only what the engine said of it is passed on.
                headers.append((b"content-type", content_type))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        except asyncio.CancelledError:
            if outcome is None:
                # The client left before any of the answer came, as clients of a replica that
                # hangs do: a rollout's verdict counts that against the replica.
                started = exchange.first_byte_at is not None
                outcome = Outcome.CANCELLED if started else Outcome.ABANDONED
                if tokens is not None and not watch.fired:
                    exchange.note = "the gateway stopped mid-stream"
                    self._stream_cut(exchange, "gateway_stopping", STREAM_STOPPED_DETAIL)
                if tokens is not None and key.tpm is not None:
                    # Cut short mid-stream: what was sent was generated for the client, and
                    # is charged (one token per event; the usage chunk never came), or a
                    # client could read all of every answer but its end for nothing.
                    self._spend(key, tokens.total())
            raise
        finally:
            if opened is not None:
                opened.close()
                self._count(exchange, opened, outcome, tokens, error_event_status)
                if tokens is not None and tokens.unusable:
                    self._usage_unusable(exchange)

    def _count(
        self,
        exchange: CompletionExchange,
        opened: Opened,
        outcome: Outcome | None,
        tokens: StreamTokens | None,
        error_event_status: int | None = None,
    ) -> None:
        """Count the answer against its replica. ``tokens`` is set for a streamed 2xx;
        ``error_event_status``, for one the engine ended with an error event, which is no
        2xx answer to time."""
        if outcome is None:
            return  # a bug of the gateway's own (logged as one), not the replica's doing
        sent_at = opened.sent_at
        first_at = exchange.first_byte_at if tokens is not None else None
        ended_at = exchange.ended_at
        ttft_s = None if first_at is None else first_at - sent_at
        latency_s = tpot_s = None
        answered_2xx = opened.answer.status < 300 and error_event_status is None
        if outcome is Outcome.ANSWERED and ended_at is not None and answered_2xx:
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

    def _stream_cut(self, exchange: CompletionExchange, reason: str, detail: str) -> None:
        """A stream whose 200 head went out ended before its end: its request's line reads
        as a success (status 200), so it is counted and logged apart, at warning, for the
        operator to see an engine that dies under its streams."""
        self._metrics.stream_cut(exchange.model, reason)
        log.warning(
            "stream_cut_off",
            detail=detail,
            model=exchange.model,
            replica_id=exchange.replica,
            reason=reason,
        )

    def refused(self, exchange: CompletionExchange, refusal: RouteRefused) -> ApiError:
        """The answer to a request the router found no replica for, counted by reason. A
        503 that autoscaling or an operator means (the model is scaled to zero, its replicas
        are starting, its cold start outlasted the hold, or the gateway stopped while it was
        held) is no fault of
        the gateway's or an engine's: its request line says what happened, below error
        level (``finish``)."""
        model = exchange.model
        match refusal:
            case ModelRemoved():
                # Held while the model was removed: the answer a retry would get, not a
                # 503 that tells the client to retry.
                reason, error = "model_removed", model_not_found(model)
            case NoServingReplica(starting=starting) if starting > 0:
                reason, error = "replicas_starting", replicas_starting(model, starting)
                exchange.note = f"the model's replicas are starting: {starting} not serving yet"
                exchange.log_level = logging.INFO  # a deploy under way, not a fault
            case NoServingReplica(scaled_to_zero=scaled_to_zero):
                reason = "no_serving_replica"
                error = no_serving_replica(model, scaled_to_zero=scaled_to_zero)
                if scaled_to_zero:
                    exchange.note = "the model is scaled to zero by its operator"
                    exchange.log_level = logging.INFO  # the operator's own choice
            case FailingToStart(failures=failures, retry_after_s=retry_after_s):
                reason = "failing_to_start"
                error = failing_to_start(model, failures, retry_after_s)
                # An error still: engines failing is for an operator to look into.
                exchange.note = f"the model is failing to start: {failures_told(failures)}"
            case Saturated(retry_after_s=retry_after_s, starting=starting):
                reason, error = "saturated", saturated(model, retry_after_s, starting=starting)
            case ColdStartTimedOut(timeout_s=timeout_s, retry_after_s=retry_after_s):
                reason = "cold_start_timeout"
                error = cold_start_timed_out(model, timeout_s, retry_after_s)
                exchange.note = (
                    "held for the model's cold start, which served no replica within "
                    f"{timeout_s:g} s"
                )
                # Worth a look (cold starts slower than the timeout), but no fault.
                exchange.log_level = logging.WARNING
            case GatewayStopping():
                reason, error = "gateway_stopping", gateway_stopping(model)
                exchange.note = "held for the model's cold start when the gateway began stopping"
                exchange.log_level = logging.INFO  # its operator stopped it; another answers
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

    def finish(self, exchange: CompletionExchange) -> None:
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
        # engine's generation time is the engine's. A refusal that autoscaling means
        # carries its own level (``refused``).
        level = exchange.log_level
        if level is None:
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
