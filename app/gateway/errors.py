"""Errors the gateway answers with, always in OpenAI's shape.

Every refusal is an ``ApiError``; ``body`` writes it as
``{"error": {"message", "type", "param", "code"}}`` (``wire.openai_error``), which every
OpenAI client parses.
What engines answer is put in the same shape by ``app.gateway.engine_error_body``.

Exception tree::

    ApiError                  a response the gateway sends instead of the engine's
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import msgspec

from app.domain.failure_count import failures_told
from app.gateway.ratelimit import Quota, RateDecision
from app.listeners.http11 import retry_after_header
from wire.openai_error import ErrorBody, ErrorDetail

Header = tuple[bytes, bytes]

MAX_ECHOED_MODEL_CHARS = 256
"""A request's unknown model name, or unknown path, is told back up to this many
characters."""

TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


_encode = msgspec.json.Encoder().encode

_NO_RETRY = (b"x-should-retry", b"false")
"""Not a standard header, but the ``openai`` SDKs obey it before anything else: their
``_should_retry`` returns False on ``x-should-retry: false``, where it would otherwise
retry every 408, 409, 429 and 5xx (twice, by default). Sent where the same request
cannot succeed by being sent again shortly."""


class ApiError(Exception):
    """A response in OpenAI's error shape, with the headers that go with it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: tuple[Header, ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or type_for_status(status)
        self.code = code
        self.param = param
        self.headers = headers

    def body(self) -> bytes:
        return _encode(ErrorBody(ErrorDetail(self.message, self.type, self.param, self.code)))


def type_for_status(status: int) -> str:
    if status >= 500:
        return "server_error"
    return TYPE_BY_STATUS.get(status, "invalid_request_error")


# -- the gateway's own refusals ------------------------------------------------------------


def invalid_api_key(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


def expired_api_key(expires_at: float) -> ApiError:
    """The key is right but its time is up. The code stays ``invalid_api_key``, which
    clients already handle; the message says when (only its holder could present it)."""
    at = datetime.fromtimestamp(expires_at, UTC)
    return invalid_api_key(f"This API key expired at {at:%Y-%m-%dT%H:%M:%SZ}.")


def too_many_failed_authentications(retry_after_s: float) -> ApiError:
    """The client's address sent too many incorrect keys: 429 until it has earned one back.

    Only an incorrect key is ever refused so (a valid one is served from any address), and
    sending it again cannot succeed: ``x-should-retry: false`` keeps the ``openai`` SDKs,
    which retry every 429 by default, from sending it twice more for nothing."""
    return _retry_later(
        "Too many requests with an incorrect API key from your address; retry after "
        f"{math.ceil(retry_after_s)} s.",
        "too_many_failed_authentications",
        retry_after_s,
        retry=False,
    )


def model_not_found(model: str) -> ApiError:
    # The same answer whether the model is undeclared or outside the key's scope, so a
    # key cannot learn which models exist beyond its own.
    # No model is named so (63 characters at most): the name a client sent is not sent
    # back whole, which for a body of 32 MiB would be as much again.
    return ApiError(
        404,
        f"The model `{_echoed(model)}` does not exist or you do not have access to it.",
        type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def model_id_missing() -> ApiError:
    """``GET /v1/models/`` with nothing after it: a path left incomplete (a client that
    built it from an empty name), 404 as any other path without a route is, in words that
    say what is missing rather than that a model named nothing does not exist."""
    return ApiError(
        404,
        "No model id after /v1/models/: GET /v1/models/{model} retrieves one model, "
        "GET /v1/models lists those your key may use.",
        type="invalid_request_error",
        code="not_found",
    )


def _echoed(text: str) -> str:
    """A name or path the client sent, told back up to ``MAX_ECHOED_MODEL_CHARS``: a path
    may be as long as the listener's 64 KiB of headers, and is no use whole in a message."""
    if len(text) > MAX_ECHOED_MODEL_CHARS:
        return text[:MAX_ECHOED_MODEL_CHARS] + "..."
    return text


def api_not_served(model: str, api: str, path: str) -> ApiError:
    """``model`` exists for the key, but its spec does not name ``api``: 404 with the code
    of an unknown model, so clients treat both alike, and a message that says which."""
    return ApiError(
        404,
        f"The model `{model}` is not served on {path} (its spec does not name the `{api}` "
        "API); GET /v1/models says what each model serves.",
        type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def invalid_request(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(400, message, type="invalid_request_error", param=param)


def header_repeated(name: str) -> ApiError:
    """A field that may appear once (RFC 9110 5.3: ``Authorization``) came more than once:
    which one counts is ambiguous, and a proxy in front may have read the other."""
    return invalid_request(f"The {name} header appears more than once: send it once.")


def not_found(path: str, *, served_at: str | None = None) -> ApiError:
    """No route for ``path``; ``served_at``: the path the client most likely meant, which
    the message names (a client whose base URL leaves out ``/v1``)."""
    message = f"No route for {_echoed(path)}."
    if served_at is not None:
        message += (
            f" The API is under /v1: {_echoed(served_at)}. An OpenAI client's base URL ends "
            "in /v1 (http://host:port/v1)."
        )
    return ApiError(404, message, type="invalid_request_error", code="not_found")


def method_not_allowed(method: str, path: str) -> ApiError:
    """405 with ``Allow``, which RFC 9110 requires of one: ``method`` is the path's only,
    with HEAD beside a GET (every GET route answers it, ``app.gateway.asgi.takes``)."""
    allowed = "GET, HEAD" if method == "GET" else method
    return ApiError(
        405,
        f"Use {method} for {_echoed(path)}.",
        type="invalid_request_error",
        code="method_not_allowed",
        headers=((b"allow", allowed.encode()),),
    )


_CLOSE = (b"connection", b"close")


def body_too_large(limit: int) -> ApiError:
    """413, and the connection closes after it: the rest of the body, which may still be
    coming (sent chunked, or by a client that did not wait for ``100 Continue``), is not
    read for nothing (``app.listeners.httpserver`` drops what comes until the client has
    seen the answer)."""
    return ApiError(
        413,
        f"The request body exceeds {limit} bytes.",
        type="invalid_request_error",
        headers=(_CLOSE,),
    )


SDK_RETRY_AFTER_MAX_S = 60.0
"""The longest ``retry-after-ms`` the ``openai`` SDKs wait as told (the 3.x releases up to
120 s; older ones wait 0.5 to 8 s past 60 s, which would only be refused again)."""


def _per_minute(limit: int, unit: str) -> str:
    """``1 request per minute``, ``60 requests per minute``."""
    return f"{limit} {unit if limit == 1 else unit + 's'} per minute"


def quota_exceeded(decision: RateDecision) -> ApiError:
    """The key is over its rpm or tpm: 429 that clients retry once ``retry-after-ms`` has
    passed, not at once. The ``openai`` SDKs do so for a 429 by default, as OpenAI's own
    quota refusals have them do; ``x-should-retry: false`` is sent only when the wait is
    longer than they honour (``SDK_RETRY_AFTER_MAX_S``): they would retry too early."""
    requests, tokens = decision.requests, decision.tokens
    if requests is not None and requests.remaining < 1:
        message = f"Rate limit reached: {_per_minute(requests.limit, 'request')} for this key."
    elif tokens is not None:
        message = f"Rate limit reached: {_per_minute(tokens.limit, 'token')} for this key."
    else:
        message = "Rate limit reached for this key."
    # Rounded up, as the headers are: a client reading the message never comes back early.
    message += f" Retry after {math.ceil(decision.retry_after_s * 10) / 10:.1f} s."
    retry_after: tuple[Header, ...] = (
        (b"retry-after", retry_after_header(decision.retry_after_s)),
        (b"retry-after-ms", b"%d" % math.ceil(decision.retry_after_s * 1000)),
    )
    if decision.retry_after_s > SDK_RETRY_AFTER_MAX_S:
        retry_after += (_NO_RETRY,)
    headers = (*retry_after, *rate_limit_headers(decision))
    return ApiError(
        429, message, type="rate_limit_error", code="rate_limit_exceeded", headers=headers
    )


def quota_reason(decision: RateDecision) -> str:
    """Which limit refused the request, for the rejections counter."""
    requests = decision.requests
    return "rpm" if requests is not None and requests.remaining < 1 else "tpm"


def rate_limit_headers(decision: RateDecision) -> tuple[Header, ...]:
    """``x-ratelimit-*`` as OpenAI writes them, for the limits the key has."""
    # Every answer of a limited key carries these: the names are built once, not per answer.
    requests, tokens = decision.requests, decision.tokens
    if requests is None:
        return () if tokens is None else _quota_headers(_TOKENS, tokens)
    if tokens is None:
        return _quota_headers(_REQUESTS, requests)
    return _quota_headers(_REQUESTS, requests) + _quota_headers(_TOKENS, tokens)


def _names(kind: bytes) -> tuple[bytes, bytes, bytes]:
    return (
        b"x-ratelimit-limit-" + kind,
        b"x-ratelimit-remaining-" + kind,
        b"x-ratelimit-reset-" + kind,
    )


_REQUESTS = _names(b"requests")
_TOKENS = _names(b"tokens")


def _quota_headers(names: tuple[bytes, bytes, bytes], quota: Quota) -> tuple[Header, ...]:
    limit, remaining, reset = names
    return (
        (limit, b"%d" % quota.limit),
        (remaining, b"%d" % quota.remaining),
        (reset, duration_header(quota.reset_s)),
    )


def duration_header(seconds: float) -> bytes:
    """A duration as OpenAI's rate-limit headers write it: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return b"%dms" % math.ceil(seconds * 1000)
    if seconds < 60:
        return (b"%.3f" % seconds).rstrip(b"0").rstrip(b".") + b"s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return b"%dm%ds" % (minutes, rest)


def saturated(model: str, retry_after_s: float, *, starting: bool = False) -> ApiError:
    """Every replica is at capacity, or (``starting``) the model has none yet and the
    gateway holds as many requests as it may."""
    if starting:
        message = (
            f"The model `{model}` is starting from zero and the gateway holds as many "
            f"requests as it may; retry after {retry_after_s:g} s."
        )
    else:
        message = f"Every replica of `{model}` is at capacity; retry after {retry_after_s:g} s."
    return _retry_later(message, "engine_overloaded", retry_after_s)


def _retry_later(message: str, code: str, retry_after_s: float, *, retry: bool = True) -> ApiError:
    """429 with ``Retry-After``: the client may try again once that time has passed; with
    ``retry`` false, the same request will not succeed then either (``_NO_RETRY``)."""
    retry_after = (b"retry-after", retry_after_header(retry_after_s))
    headers = (retry_after,) if retry else (retry_after, _NO_RETRY)
    return ApiError(429, message, type="rate_limit_error", code=code, headers=headers)


STARTING_RETRY_AFTER_S = 5.0
"""What a request for a model whose replicas are starting is told: a replica loads its
weights in seconds to minutes, and a retry every few seconds finds the first that serves
soon after it does, without a client polling hard meanwhile."""


def replicas_starting(model: str, starting: int) -> ApiError:
    """``model`` has no serving replica yet, and ``starting`` of its replicas are placed or
    starting (it was just declared or scaled up, or every replica is being replaced): one
    may serve within seconds. A code of its own, so that a client tells a deploy under way
    from a model nothing serves."""
    replicas = "1 of its replicas is" if starting == 1 else f"{starting} of its replicas are"
    return _unavailable(
        f"The model `{model}` has no serving replica yet: {replicas} starting; "
        "retry in a few seconds.",
        "replicas_starting",
        STARTING_RETRY_AFTER_S,
    )


def no_serving_replica(model: str, *, scaled_to_zero: bool = False) -> ApiError:
    """``scaled_to_zero``: its operator scaled it to 0 replicas, and without an autoscaling
    policy none comes back until an operator scales it up: no use trying again shortly."""
    if scaled_to_zero:
        message = (
            f"The model `{model}` is scaled to zero by its operator; it has no replica until "
            "an operator scales it up."
        )
        return ApiError(
            503, message, type="server_error", code="no_serving_replica", headers=(_NO_RETRY,)
        )
    message = f"The model `{model}` has no serving replica right now; try again shortly."
    return ApiError(503, message, type="server_error", code="no_serving_replica")


def failing_to_start(model: str, failures: int, retry_after_s: float) -> ApiError:
    """``model`` has no replica and ``failures`` in a row, as the control plane counts them
    (``Model.failures``: starts that failed, and engines that crashed soon after serving),
    told in its words (``failures_told``): the next is started in ``retry_after_s``. Why
    they failed is not told: an engine's error names the fleet's nodes, paths and hardware,
    which are the operators' to read (``llmgw-cli model``), not every client's."""
    return _unavailable(
        f"The model `{model}` is failing to start: {failures_told(failures)}; "
        f"the next attempt is in {math.ceil(retry_after_s)} s.",
        "model_failing_to_start",
        retry_after_s,
    )


def cold_start_timed_out(model: str, timeout_s: float, retry_after_s: float) -> ApiError:
    """A request held while ``model`` started from zero: no replica served in time."""
    return _unavailable(
        f"The model `{model}` is starting from zero and no replica served within "
        f"{timeout_s:g} s; retry after {math.ceil(retry_after_s)} s.",
        "cold_start_timeout",
        retry_after_s,
    )


_RETRY_ELSEWHERE = "retry after 1 s: another gateway will answer."
"""What a client told that this gateway is shutting down is to do, and why it may: another
gateway behind the same address takes the request again at once."""


def gateway_stopping(model: str) -> ApiError:
    """A request held while ``model`` started from zero, turned away as this gateway stops:
    another gateway (behind the same address) holds it again at once."""
    return _unavailable(
        f"The model `{model}` is starting from zero and this gateway is shutting down; "
        + _RETRY_ELSEWHERE,
        "gateway_shutting_down",
        1.0,
    )


def _unavailable(message: str, code: str, retry_after_s: float) -> ApiError:
    """503 with ``Retry-After``: the model cannot be served now, and may be once that time
    has passed."""
    retry_after = (b"retry-after", retry_after_header(retry_after_s))
    return ApiError(503, message, type="server_error", code=code, headers=(retry_after,))


def upstream_unreachable(model: str, reason: str) -> ApiError:
    return ApiError(
        502,
        f"No replica of `{model}` could be reached: {reason}",
        type="server_error",
        code="upstream_unreachable",
    )


def upstream_invalid_answer(model: str, reason: str) -> ApiError:
    """A replica answered with something the gateway does not relay (docs/gateway.md, "What
    an engine may send"): its connection was dropped."""
    return ApiError(
        502,
        f"A replica of `{model}` sent an answer the gateway does not relay: {reason}",
        type="server_error",
        code="upstream_invalid_answer",
    )


def upstream_disconnected(model: str, reason: str) -> ApiError:
    """A replica's answer, read whole to be sent on, broke off before its end (the engine
    closed its connection, or sent what is not HTTP): nothing of it reached the client. A
    stream cut so ends with an error event of the same code (``stream_error_events``)."""
    return ApiError(
        502,
        f"A replica of `{model}` broke off its answer: {reason}",
        type="server_error",
        code="upstream_disconnected",
    )


def upstream_timeout(model: str, reason: str) -> ApiError:
    """A replica did not answer within the gateway's bound (``--engine-head-timeout``), or
    went silent before its answer was sent on: its connection was dropped."""
    return ApiError(
        504,
        f"A replica of `{model}` did not answer in time: {reason}",
        type="server_error",
        code="upstream_timeout",
    )


def internal_error() -> ApiError:
    return ApiError(
        500, "The gateway failed to handle the request; it has been logged.", code="internal_error"
    )


def listener_refusal(status: int, message: str) -> tuple[bytes, bytes]:
    """A refusal written by the listener itself (a slow client cut off), in OpenAI's shape:
    its content type and body."""
    return b"application/json", ApiError(status, message).body()


def stream_error_events(message: str, code: str = "upstream_disconnected") -> bytes:
    """What ends a stream cut short (its engine died mid-way, or the gateway stopped): an
    error event, then ``[DONE]``."""
    error = ErrorBody(ErrorDetail(message, "server_error", None, code))
    return b"data: " + _encode(error) + b"\n\ndata: [DONE]\n\n"


STOPPED_MID_STREAM = stream_error_events(
    "This gateway is shutting down and cut the stream off before its end; retry the request.",
    "gateway_shutting_down",
)
"""What ends a stream still open when the gateway's graceful shutdown ends."""


def gateway_stopped() -> ApiError:
    """A request still unanswered when this gateway's graceful shutdown ended: another
    gateway (behind the same address) takes it again at once."""
    return ApiError(
        503,
        "This gateway is shutting down and could not answer the request in time; "
        + _RETRY_ELSEWHERE,
        type="server_error",
        code="gateway_shutting_down",
        headers=((b"retry-after", retry_after_header(1.0)),),
    )
