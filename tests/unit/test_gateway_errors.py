"""Every error a client gets from the gateway has OpenAI's shape, whatever the engine sent."""

from __future__ import annotations

import msgspec
import pytest

from app.gateway.engine_error_body import (
    MAX_ENGINE_MESSAGE_CHARS,
    engine_error,
    normalize_engine_error,
    stream_errors,
)
from app.gateway.errors import (
    duration_header,
    failing_to_start,
    invalid_api_key,
    method_not_allowed,
    model_not_found,
    no_serving_replica,
    not_found,
    quota_exceeded,
    quota_reason,
    rate_limit_headers,
    replicas_starting,
    saturated,
    stream_error_events,
    too_many_failed_authentications,
)
from app.gateway.ratelimit import Quota, RateDecision, RateLimiter
from app.listeners.http11 import retry_after_header


def error_of(body: bytes) -> dict[str, object]:
    decoded = msgspec.json.decode(body)
    assert list(decoded) == ["error"]
    error: dict[str, object] = decoded["error"]
    assert list(error) == ["message", "type", "param", "code"]
    return error


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(
            400,
            b'{"error": {"message": "bad", "type": "invalid_request_error", "param": "n",'
            b' "code": "x"}}',
            {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "x"},
            id="openai",
        ),
        pytest.param(
            400,
            b'{"error": {"message": "bad", "type": "BadRequestError", "param": null, "code": 400}}',
            {"message": "bad", "type": "invalid_request_error", "param": None, "code": None},
            id="vllm-new",
        ),
        pytest.param(
            422,
            b'{"detail": "too long"}',
            {"message": "too long", "type": "invalid_request_error", "param": None, "code": None},
            id="flat",
        ),
        pytest.param(
            400,
            b'{"object": "error", "message": "no", "type": "BadRequestError", "param": null,'
            b' "code": 400}',
            {"message": "no", "type": "invalid_request_error", "param": None, "code": None},
            id="vllm-old",
        ),
        pytest.param(
            500,
            b'{"message": "boom"}',
            {"message": "boom", "type": "server_error", "param": None, "code": None},
            id="bare-message",
        ),
        pytest.param(
            503,
            b'{"error": "overloaded", "error_type": "overloaded"}',
            {"message": "overloaded", "type": "server_error", "param": None, "code": None},
            id="tgi",
        ),
        pytest.param(
            502,
            b"<html>Bad gateway</html>",
            {"message": "<html>Bad gateway</html>", "type": "server_error", "param": None,
             "code": None},
            id="text",
        ),
        pytest.param(
            404,
            b"",
            {"message": "The engine answered HTTP 404 with no message.",
             "type": "not_found_error", "param": None, "code": None},
            id="empty",
        ),
    ],
)  # fmt: skip
def test_engine_errors_are_normalized(status: int, body: bytes, expected: object) -> None:
    assert error_of(normalize_engine_error(status, body)) == expected


@pytest.mark.parametrize(
    ("status", "body", "type_", "unrelayed"),
    [
        (400, b'{"error": {"message": "m", "type": "BadRequestError", "code": 400}}',
         "invalid_request_error", "type=BadRequestError code=400"),
        (400, b'{"error": {"code": 400, "message": "m", "type": "exceed_context_size_error",'
              b' "n_prompt_tokens": 9000, "n_ctx": 4096}}',
         "invalid_request_error", "type=exceed_context_size_error code=400"),
        (500, b'{"error": {"code": 500, "message": "m", "type": "server_error"}}',
         "server_error", "code=500"),
        (429, b'{"error": {"message": "m", "type": "insufficient_quota",'
              b' "code": "insufficient_quota"}}',
         "insufficient_quota", None),
        (404, b'{"error": {"message": "m", "type": "' + b"x" * 500 + b'"}}',
         "not_found_error", "type=" + "x" * 64 + "..."),
        (400, b'{"error": {"message": "m", "type": {"nested": 1}, "code": [4, 0, 0]}}',
         "invalid_request_error", 'type={"nested":1} code=[4,0,0]'),
    ],
    ids=["vllm", "llama.cpp", "llama.cpp-500", "openai-quota", "long-type", "odd-values"],
)  # fmt: skip
def test_an_engines_own_type_is_replaced_by_its_statuss_and_kept_for_the_log(
    status: int, body: bytes, type_: str, unrelayed: str | None
) -> None:
    # The engine's own type ("BadRequestError", "exceed_context_size_error") reached the
    # client, where an OpenAI client branches on OpenAI's types.
    error = engine_error(status, body)

    assert error_of(error.body)["type"] == type_
    assert error_of(error.body)["message"] == "m"
    assert error.unrelayed == unrelayed


def test_an_error_event_in_a_stream_is_put_in_openais_shape_by_the_status_its_code_names() -> None:
    chunk = b'data: {"choices": [{"delta": {"content": "error"}}], "error": null}\n\n'
    events = (
        chunk
        + b'data: {"error": {"message": "m", "type": "BadRequestError", "code": 400}}\r\n\r\n'
        + b'data:{"object": "error", "message": "n", "type": "EngineDeadError", "code": 503}\n\n'
        + b'data: {"error": "no code", "error_type": "oops"}\n\n'
        + b'data: {"error": {"message": "not JSON"\n\n'
        + b"data: [DONE]\n\n"
    )

    errors = stream_errors(events)
    normalized, unrelayed = errors.events, errors.unrelayed

    assert normalized == (
        chunk + b'data: {"error":{"message":"m","type":"invalid_request_error","param":null,'
        b'"code":null}}\r\n\r\n'
        + b'data: {"error":{"message":"n","type":"server_error","param":null,"code":null}}\n\n'
        + b'data: {"error":{"message":"no code","type":"server_error","param":null,'
        b'"code":null}}\n\n' + b'data: {"error": {"message": "not JSON"\n\n' + b"data: [DONE]\n\n"
    )
    assert unrelayed == ("type=BadRequestError code=400; type=EngineDeadError code=503; type=oops")


def test_a_stream_without_an_error_event_is_left_as_it_is() -> None:
    events = b'data: {"choices": [{"delta": {"content": "\\"error\\""}}]}\n\n'

    errors = stream_errors(events)
    assert (errors.events, errors.unrelayed) == (events, None)


def test_structured_detail_is_kept_as_json_text() -> None:
    body = b'{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}'
    message = error_of(normalize_engine_error(422, body))["message"]
    assert message == '[{"loc":["body","messages"],"msg":"field required"}]'


def test_a_huge_engine_message_is_cut() -> None:
    error = error_of(normalize_engine_error(500, b"x" * 100_000))
    assert isinstance(error["message"], str)
    assert len(error["message"]) == MAX_ENGINE_MESSAGE_CHARS + 3


def test_gateway_refusals_have_the_openai_codes() -> None:
    assert error_of(invalid_api_key("nope").body())["code"] == "invalid_api_key"
    assert invalid_api_key("nope").status == 401
    not_found = model_not_found("m")
    assert (not_found.status, not_found.param, not_found.code) == (404, "model", "model_not_found")


def test_an_unknown_model_is_named_back_only_in_part() -> None:
    body = model_not_found("m" * (32 << 20)).body()  # a whole request body of a name
    message = error_of(body)["message"]
    assert isinstance(message, str)
    assert len(body) < 1000  # was the name whole: 32 MiB
    assert "`" + "m" * 200 in message
    assert message.endswith("...` does not exist or you do not have access to it.")


def test_a_path_is_told_back_only_in_part() -> None:
    # A path may be as long as the listener's 64 KiB of headers: a 404 or 405 is no copy
    # of it, and the hint of a path under /v1 no second copy.
    long = "/models/" + "m" * 60_000
    for error in (
        not_found(long, served_at="/v1" + long),
        method_not_allowed("GET", "/v1" + long),
    ):
        body = error.body()
        assert len(body) < 1000
        assert "m" * 200 in str(error_of(body)["message"])
    assert error_of(not_found("/v1/files").body())["message"] == "No route for /v1/files."


def test_a_saturated_model_is_retryable() -> None:
    error = saturated("m", 1.2)
    assert error.status == 429
    assert dict(error.headers) == {b"retry-after": b"2"}


def test_a_model_failing_to_start_says_what_failed_and_when_the_next_attempt_is() -> None:
    # Before, "its last 3 replicas failed": the count is the control plane's, which takes
    # in engines that crashed soon after serving, and is told in its words.
    error = failing_to_start("m", 3, 37.2)
    assert (error.status, error.code) == (503, "model_failing_to_start")
    assert dict(error.headers) == {b"retry-after": b"38"}
    assert error_of(error.body())["message"] == (
        "The model `m` is failing to start: 3 failures in a row (starts that failed or "
        "engines that crashed within 60s of serving); the next attempt is in 38 s."
    )
    one = failing_to_start("m", 1, 1.0)
    assert error_of(one.body())["message"] == (
        "The model `m` is failing to start: 1 failure (a start that failed or an engine that "
        "crashed within 60s of serving); the next attempt is in 1 s."
    )


def test_a_model_its_operator_scaled_to_zero_is_not_to_be_tried_again_shortly() -> None:
    error = no_serving_replica("m", scaled_to_zero=True)
    # No Retry-After, and the openai SDKs, which retry every 5xx twice by default, are
    # told not to: no replica comes back until an operator scales the model up.
    assert (error.status, error.code) == (503, "no_serving_replica")
    assert dict(error.headers) == {b"x-should-retry": b"false"}
    message = error_of(error.body())["message"]
    assert message == (
        "The model `m` is scaled to zero by its operator; it has no replica until an operator "
        "scales it up."
    )
    assert "shortly" in str(error_of(no_serving_replica("m").body())["message"])
    assert no_serving_replica("m").headers == ()  # may be retried: a replica may serve soon


def test_a_model_whose_replicas_are_starting_is_to_be_tried_again_in_a_few_seconds() -> None:
    error = replicas_starting("m", 2)
    # Its own code, so a client tells a deploy under way from a model nothing serves, and a
    # Retry-After that the openai SDKs honour.
    assert (error.status, error.code) == (503, "replicas_starting")
    assert dict(error.headers) == {b"retry-after": b"5"}
    assert error_of(error.body()) == {
        "message": (
            "The model `m` has no serving replica yet: 2 of its replicas are starting; "
            "retry in a few seconds."
        ),
        "type": "server_error",
        "param": None,
        "code": "replicas_starting",
    }
    one = error_of(replicas_starting("m", 1).body())["message"]
    assert one == (
        "The model `m` has no serving replica yet: 1 of its replicas is starting; "
        "retry in a few seconds."
    )


def test_too_many_wrong_keys_is_not_to_be_retried_by_the_sdk() -> None:
    # Only an incorrect key gets this 429 (a valid one is served from any address): sent
    # again it fails again, so the SDK's default two retries would only spend more.
    error = too_many_failed_authentications(2.5)
    assert (error.status, error.type, error.code) == (
        429,
        "rate_limit_error",
        "too_many_failed_authentications",
    )
    assert dict(error.headers) == {b"retry-after": b"3", b"x-should-retry": b"false"}


def test_a_quota_refusal_says_which_limit_and_when_to_retry() -> None:
    """The SDKs retry it after ``retry-after-ms``, as they do OpenAI's own: before, it said
    ``x-should-retry: false`` and an application written for OpenAI got its error at once."""
    decision = RateDecision(
        allowed=False,
        retry_after_s=12.5,
        requests=Quota(limit=1, remaining=0, reset_s=47.5),
        tokens=Quota(limit=1000, remaining=990, reset_s=47.5),
    )
    error = quota_exceeded(decision)
    headers = dict(error.headers)
    assert error.status == 429
    assert "1 request per minute for this key" in error.message
    assert quota_reason(decision) == "rpm"
    assert headers == {
        b"retry-after": b"13",
        b"retry-after-ms": b"12500",
        b"x-ratelimit-limit-requests": b"1",
        b"x-ratelimit-remaining-requests": b"0",
        b"x-ratelimit-reset-requests": b"47.5s",
        b"x-ratelimit-limit-tokens": b"1000",
        b"x-ratelimit-remaining-tokens": b"990",
        b"x-ratelimit-reset-tokens": b"47.5s",
    }


@pytest.mark.parametrize(
    ("retry_after_s", "should_retry"),
    [(0.05, None), (59.9, None), (60.0, None), (60.001, b"false"), (61.0, b"false")],
)
def test_a_quota_refusal_is_not_retried_by_the_sdks_only_past_the_wait_they_honour(
    retry_after_s: float, should_retry: bytes | None
) -> None:
    decision = RateDecision(
        allowed=False,
        retry_after_s=retry_after_s,
        requests=Quota(limit=2, remaining=0, reset_s=retry_after_s),
        tokens=None,
    )
    assert dict(quota_exceeded(decision).headers).get(b"x-should-retry") == should_retry


def test_a_token_quota_refusal() -> None:
    decision = RateDecision(
        allowed=False,
        retry_after_s=3.0,
        requests=None,
        tokens=Quota(limit=100, remaining=0, reset_s=61.0),
    )
    assert quota_reason(decision) == "tpm"
    assert "100 tokens per minute" in quota_exceeded(decision).message


@pytest.mark.parametrize(
    ("requests", "tokens", "said"),
    [
        (Quota(limit=1, remaining=0, reset_s=60.0), None, "1 request per minute"),
        (Quota(limit=2, remaining=0, reset_s=60.0), None, "2 requests per minute"),
        (None, Quota(limit=1, remaining=0, reset_s=60.0), "1 token per minute"),
        (None, Quota(limit=5, remaining=0, reset_s=60.0), "5 tokens per minute"),
    ],
)
def test_a_quota_refusal_counts_its_limit_in_words_a_client_reads(
    requests: Quota | None, tokens: Quota | None, said: str
) -> None:
    """A key of --rpm 1 was told "1 requests per minute"."""
    decision = RateDecision(allowed=False, retry_after_s=60.0, requests=requests, tokens=tokens)
    assert quota_exceeded(decision).message.startswith(f"Rate limit reached: {said} for this key.")


@pytest.mark.parametrize("limits", ["rpm", "tpm", "rpm and tpm", "none"])
def test_an_answer_carries_the_rate_limit_headers_of_the_limits_its_key_has(limits: str) -> None:
    requests = Quota(limit=60, remaining=59, reset_s=0.5)
    tokens = Quota(limit=1000, remaining=744, reset_s=75.0)
    decision = RateDecision(
        allowed=True,
        retry_after_s=0.0,
        requests=requests if "rpm" in limits else None,
        tokens=tokens if "tpm" in limits else None,
    )
    expected = []
    if "rpm" in limits:
        expected += [
            (b"x-ratelimit-limit-requests", b"60"),
            (b"x-ratelimit-remaining-requests", b"59"),
            (b"x-ratelimit-reset-requests", b"500ms"),
        ]
    if "tpm" in limits:
        expected += [
            (b"x-ratelimit-limit-tokens", b"1000"),
            (b"x-ratelimit-remaining-tokens", b"744"),
            (b"x-ratelimit-reset-tokens", b"1m15s"),
        ]
    assert rate_limit_headers(decision) == tuple(expected)


T0 = 6000.0
"""The start of one of the rate limiter's fixed buckets."""


@pytest.mark.parametrize(
    ("arrivals", "refused_at", "retry_after", "retry_after_ms", "reset"),
    [
        # A burst at the very start of a bucket, refused at once.
        ((T0, T0, T0), T0, b"60", b"60000", b"1m0s"),
        # A burst at the very end of a bucket, refused at once.
        ((T0 + 59.999,) * 3, T0 + 59.999, b"60", b"60000", b"1m0s"),
        # Spread over the previous bucket, refused just after the boundary: the first of them
        # is still in the window; the last leaves it 59 s later.
        ((T0 + 30, T0 + 45, T0 + 59), T0 + 60, b"40", b"39667", b"59s"),
    ],
)  # fmt: skip
def test_a_request_refusal_advertises_at_most_the_window(
    arrivals: tuple[float, ...],
    refused_at: float,
    retry_after: bytes,
    retry_after_ms: bytes,
    reset: bytes,
) -> None:
    limiter = RateLimiter()
    for now in arrivals:
        assert limiter.admit("k", rpm=3, tpm=None, now=now).allowed
    decision = limiter.admit("k", rpm=3, tpm=None, now=refused_at)
    headers = dict(quota_exceeded(decision).headers)
    assert headers[b"retry-after"] == retry_after
    assert headers[b"retry-after-ms"] == retry_after_ms
    assert headers[b"x-ratelimit-reset-requests"] == reset
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"


def test_a_token_refusal_advertises_at_most_the_window() -> None:
    limiter = RateLimiter()
    assert limiter.admit("k", rpm=None, tpm=100, now=T0).allowed
    limiter.record_tokens("k", 150, now=T0 + 1)
    headers = dict(quota_exceeded(limiter.admit("k", rpm=None, tpm=100, now=T0 + 1)).headers)
    assert headers[b"retry-after"] == b"60"
    assert headers[b"x-ratelimit-reset-tokens"] == b"1m0s"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"0"


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.0201, b"21ms"), (1.0, b"1s"), (1.5, b"1.5s"), (59.9999, b"60s"), (360.0, b"6m0s"),
     (119.2, b"2m0s")],
)  # fmt: skip
def test_durations_are_written_as_openai_does(seconds: float, expected: bytes) -> None:
    assert duration_header(seconds) == expected


@pytest.mark.parametrize(("seconds", "expected"), [(0.0, b"1"), (1.0, b"1"), (1.01, b"2")])
def test_retry_after_rounds_up_to_whole_seconds(seconds: float, expected: bytes) -> None:
    assert retry_after_header(seconds) == expected


def test_a_broken_stream_ends_with_an_error_event_and_done() -> None:
    events = stream_error_events("gone").split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert error_of(events[0].removeprefix(b"data: "))["code"] == "upstream_disconnected"


def test_a_quota_refusals_message_says_no_less_than_its_headers() -> None:
    """It rounded to the nearest tenth: "Retry after 0.8 s" with retry-after-ms 840."""
    decision = RateDecision(
        allowed=False,
        retry_after_s=0.84,
        requests=Quota(limit=2, remaining=0, reset_s=0.84),
        tokens=None,
    )
    error = quota_exceeded(decision)
    assert dict(error.headers)[b"retry-after-ms"] == b"840"
    assert error.message.endswith(" Retry after 0.9 s."), error.message


# What engines answer for a prompt over the model's context, as each writes it.
VLLM_CONTEXT_OVERFLOWS = [
    # vLLM 0.5 (vllm/entrypoints/openai/serving_engine.py, _validate_prompt_and_tokenize),
    # in its older {"object": "error", ...} shape.
    b'{"object": "error", "message": "This model\'s maximum context length is 4096 tokens. '
    b"However, you requested 4200 tokens (200 in the messages, 4000 in the completion). "
    b'Please reduce the length of the messages or completion.", "type": "BadRequestError", '
    b'"param": null, "code": 400}',
    # vLLM 0.6 to 0.9: max_tokens over what the prompt leaves.
    b'{"error": {"message": "\'max_tokens\' or \'max_completion_tokens\' is too large: 8000. '
    b"This model's maximum context length is 4096 tokens and your request has 2778 input "
    b'tokens (8000 > 4096 - 2778). None", "type": "BadRequestError", "param": null, '
    b'"code": 400}}',
    # vLLM 0.10 and later (VLLMValidationError), which names its own param.
    b'{"error": {"message": "This model\'s maximum context length is 8192 tokens. However, '
    b"you requested 64 output tokens and your prompt contains at least 8129 input tokens, "
    b"for a total of at least 8193 tokens. Please reduce the length of the input prompt or "
    b'the number of requested output tokens. (parameter=input_tokens, value=8129)", '
    b'"type": "BadRequestError", "param": "input_tokens", "code": 400}}',
]


@pytest.mark.parametrize(
    ("status", "body"),
    [
        *((400, body) for body in VLLM_CONTEXT_OVERFLOWS),
        # llama.cpp's llama-server (the dev cluster's --engine llamacpp, -c 4096 -np 4), sent
        # a chat of 3,000 words, recorded from its port.
        (400, b'{"error":{"code":400,"message":"request (3009 tokens) exceeds the available '
              b'context size (1024 tokens), try increasing it","type":'
              b'"exceed_context_size_error","n_prompt_tokens":3009,"n_ctx":1024}}'),
        # SGLang (python/sglang/srt/managers/tokenizer_manager.py), older vLLM's shape.
        (400, b'{"object": "error", "message": "The input (5000 tokens) is longer than the '
              b"model's context length (4096 tokens).\", \"type\": \"BadRequestError\", "
              b'"param": null, "code": 400}'),
        # text-generation-inference's validation, 422.
        (422, b'{"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be '
              b'<= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`", '
              b'"error_type": "validation"}'),
        (422, b'{"error": "Input validation error: `inputs` must have less than 4096 tokens. '
              b'Given: 5000", "error_type": "validation"}'),
    ],
    ids=["vllm-0.5", "vllm-0.6", "vllm-0.10", "llama.cpp", "sglang", "tgi-total", "tgi-input"],
)  # fmt: skip
def test_a_prompt_over_the_context_gets_openais_context_length_exceeded(
    status: int, body: bytes
) -> None:
    """Applications shorten the conversation and retry on OpenAI's code: before, each
    engine's own words reached them with no code, or the status repeated."""
    error = error_of(normalize_engine_error(status, body))

    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
    assert "context" in str(error["message"]) or "`inputs`" in str(error["message"])


def test_llama_cpps_overflow_keeps_its_type_and_code_for_the_log() -> None:
    body = (
        b'{"error":{"code":400,"message":"request (3009 tokens) exceeds the available context '
        b'size (1024 tokens), try increasing it","type":"exceed_context_size_error",'
        b'"n_prompt_tokens":3009,"n_ctx":1024}}'
    )

    error = engine_error(400, body)

    assert error.unrelayed == "type=exceed_context_size_error code=400"


def test_a_context_message_on_a_5xx_is_no_overflow() -> None:
    # An engine failing while it speaks of its context is not the client's prompt at fault.
    body = b'{"error": {"message": "maximum context length is 0: cache broken", "code": 500}}'

    assert error_of(normalize_engine_error(500, body))["code"] is None


def test_a_context_overflow_event_in_a_stream_gets_openais_code() -> None:
    events = (
        b'data: {"error": {"message": "This model\'s maximum context length is 4096 tokens. '
        b'However, you requested 5000 tokens.", "type": "BadRequestError", "code": 400}}\n\n'
        b"data: [DONE]\n\n"
    )

    errors = stream_errors(events)
    normalized, unrelayed = errors.events, errors.unrelayed

    assert normalized.startswith(b'data: {"error":{"message":"This model\'s maximum context')
    assert b'"param":"messages","code":"context_length_exceeded"}}\n\n' in normalized
    assert unrelayed == "type=BadRequestError code=400"


def test_a_streams_error_events_name_the_highest_status_for_its_replica() -> None:
    events = (
        b'data: {"error": {"message": "m", "type": "BadRequestError", "code": 400}}\n\n'
        b'data: {"error": "no code", "error_type": "generation"}\n\n'
    )

    assert stream_errors(events).status == 500
    assert stream_errors(events[: events.index(b"\n\n") + 2]).status == 400
    assert stream_errors(b'data: {"choices": []}\n\n').status is None
