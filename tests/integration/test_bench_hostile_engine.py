"""`llmgw-cli bench`'s readers of an engine's ``/metrics`` and ``GET /v1/models`` against a
socket playing a bad engine (``tests.support.bad_engine``): a page without end, or one
declaring more than 16 MiB (a model list: 1 MiB), ends the run with one clear error
instead of being read into memory until the timeout."""

from __future__ import annotations

import pytest

from cli.bench import probe, sampler
from cli.bench.errors import BenchError, MetricsUnavailable, TargetRefused, TargetUnreachable
from cli.bench.metrics import EngineReading
from cli.bench.probe import served_models
from cli.bench.request import RequestFailed, engine_session, stream_request
from cli.bench.sampler import MetricsReader
from cli.bench.stats import RequestOutcome
from cli.bench.target import Engine
from tests.support.bad_engine import (
    GAUGE,
    MODELS_HEAD,
    PAGE_HEAD,
    BadEngine,
    Sent,
    Story,
    endless_model_list,
    endless_page,
    sse_answer,
)
from wire.metrics_page import MAX_METRICS_PAGE_BYTES

pytestmark = pytest.mark.timeout(60)

MODEL_LIST_BOUND = 1 << 20
"""``cli.bench.probe.MAX_MODEL_LIST_BYTES``, as its messages say it."""


def no_post(request: bytes) -> list[bytes]:
    raise AssertionError(f"bench sent a request while reading /metrics: {request[:80]!r}")


async def read(metrics: Story) -> EngineReading | MetricsUnavailable:
    """One reading of the bad engine's page: what was read, or the error."""
    with BadEngine(no_post, metrics=metrics) as engine:
        async with engine_session() as session:
            reader = MetricsReader(session, Engine(root_url=engine.url, model="m"))
            try:
                return await reader.read()
            except MetricsUnavailable as exc:
                return exc


async def test_a_metrics_page_without_end_is_refused_past_16_mib() -> None:
    # Before the bound bench read all that came until its 10 s timeout: the 64 MiB this
    # engine sends, or, from one that does not stop, as much as arrived in 10 s.
    sent = Sent()
    outcome = await read(endless_page(sent))

    assert isinstance(outcome, MetricsUnavailable), outcome
    assert str(outcome).endswith("/metrics goes on past 16 MiB: bench reads no more of it")
    assert sent.bytes < MAX_METRICS_PAGE_BYTES + (16 << 20)  # what the sockets' buffers hold


async def test_a_metrics_page_declaring_more_than_16_mib_is_not_read() -> None:
    head = PAGE_HEAD + b"content-length: %d\r\n\r\n" % (MAX_METRICS_PAGE_BYTES + 1)
    outcome = await read(lambda request: [head, GAUGE])

    assert isinstance(outcome, MetricsUnavailable), outcome
    assert f"declares {MAX_METRICS_PAGE_BYTES + 1} bytes, over 16 MiB" in str(outcome)


async def test_a_metrics_page_under_the_bound_is_read() -> None:
    page = GAUGE + b"# filler\n" * ((MAX_METRICS_PAGE_BYTES - 4096) // 9)
    answer = PAGE_HEAD + b"content-length: %d\r\n\r\n" % len(page)
    outcome = await read(lambda request: [answer, page])

    assert isinstance(outcome, EngineReading), outcome
    assert outcome.waiting == 0.0


async def test_a_metrics_page_that_stops_coming_says_it_took_too_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, a scrape's timeout said nothing: "GET URL failed: " and the line ended.
    monkeypatch.setattr(sampler, "SCRAPE_TIMEOUT_S", 0.2)
    stalled = PAGE_HEAD + b"transfer-encoding: chunked\r\n\r\n"
    outcome = await read(lambda request: [stalled])

    assert isinstance(outcome, MetricsUnavailable), outcome
    assert str(outcome).endswith("/metrics did not finish within 0.2 s"), str(outcome)


async def models(story: Story) -> tuple[str, list[str] | BenchError | None]:
    """The bad engine's URL and what bench made of its ``GET /v1/models``: the models it
    lists, or the error."""
    with BadEngine(story) as engine:
        async with engine_session() as session:
            try:
                return engine.url, await served_models(session, engine.url)
            except BenchError as exc:
                return engine.url, exc


async def test_a_model_list_without_end_is_refused_past_1_mib() -> None:
    # Before the bound bench read all that came until its 30 s timeout: the 64 MiB this
    # engine sends, or, from one that does not stop, as much as arrived in 30 s.
    sent = Sent()
    url, outcome = await models(endless_model_list(sent, up_to=64 << 20))

    assert isinstance(outcome, TargetRefused), outcome
    assert str(outcome).startswith(f"GET {url}/v1/models goes on past 1 MiB"), str(outcome)
    assert sent.bytes < MODEL_LIST_BOUND + (16 << 20)  # what the sockets' buffers hold


async def test_a_model_list_declaring_more_than_1_mib_is_not_read() -> None:
    head = MODELS_HEAD + b"content-length: %d\r\n\r\n" % (MODEL_LIST_BOUND + 1)
    url, outcome = await models(lambda request: [head, b'{"data":['])

    assert isinstance(outcome, TargetRefused), outcome
    assert str(outcome).startswith(
        f"GET {url}/v1/models declares {MODEL_LIST_BOUND + 1} bytes, over 1 MiB"
    ), str(outcome)


async def test_a_model_list_that_stops_coming_says_it_took_too_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, the timeout said nothing: "did not answer GET /v1/models: " and the line ended.
    monkeypatch.setattr(probe, "MODELS_TIMEOUT_S", 0.2)
    stalled = MODELS_HEAD + b"transfer-encoding: chunked\r\n\r\n"
    url, outcome = await models(lambda request: [stalled])

    assert isinstance(outcome, TargetUnreachable), outcome
    assert str(outcome) == (
        f"the engine at {url} sent no whole answer to GET /v1/models within 0.2 s"
    ), str(outcome)


def answer_counted_as(completion_tokens: int) -> Story:
    """Two text events, then a usage that counts ``completion_tokens`` output tokens."""
    text = b'{"choices": [{"text": "a"}]}'
    last = b'{"choices": [{"text": "b", "finish_reason": "length"}]}'
    usage = b'{"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": %d}}'
    return lambda request: [sse_answer(text, last, usage % completion_tokens)]


async def stream(story: Story, max_tokens: int) -> tuple[RequestOutcome | RequestFailed, int]:
    """One streamed request to the bad engine: its outcome or error, and the output tokens
    it added to the level's throughput."""
    counted: list[int] = []
    with BadEngine(story) as engine:
        async with engine_session() as session:
            target = Engine(root_url=engine.url, model="m")
            try:
                outcome: RequestOutcome | RequestFailed = await stream_request(
                    session, target, "hi", max_tokens, timeout_s=10, on_tokens=counted.append
                )
            except RequestFailed as exc:
                outcome = exc
    return outcome, sum(counted)


@pytest.mark.parametrize("completion_tokens", [1_600_000, -5])
async def test_a_usage_counting_tokens_no_answer_to_max_tokens_has_fails_the_request(
    completion_tokens: int,
) -> None:
    # Before, bench believed it: one answer of 16 tokens counted 1.6 million towards the
    # level's output tokens/s, and --apply gave the replica a weight 100,000 times its due.
    outcome, counted = await stream(answer_counted_as(completion_tokens), max_tokens=16)

    assert isinstance(outcome, RequestFailed), outcome
    assert f"counts {completion_tokens} output tokens" in str(outcome)
    assert counted <= 16


async def test_a_usage_within_max_tokens_is_the_count() -> None:
    outcome, counted = await stream(answer_counted_as(16), max_tokens=16)

    assert isinstance(outcome, RequestOutcome), outcome
    assert (outcome.output_tokens, counted) == (16, 16)


def answer_in_events(count: int, usage: bytes | None) -> Story:
    """``count`` events of one word each, the last with a finish_reason, then ``usage``."""
    text = b'{"choices": [{"text": "a"}]}'
    last = b'{"choices": [{"text": "b", "finish_reason": "length"}]}'
    tail = () if usage is None else (usage,)
    return lambda request: [sse_answer(*[text] * (count - 1), last, *tail)]


@pytest.mark.parametrize(
    "usage",
    [None, b'{"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 16}}'],
    ids=["without-usage", "usage-within-max-tokens"],
)
async def test_more_events_with_text_than_max_tokens_fail_the_request(usage: bytes | None) -> None:
    # Before, each event counted one token, however many came: 400 events of an answer
    # to 16 tokens counted 400 towards the level's output tokens/s.
    outcome, counted = await stream(answer_in_events(400, usage), max_tokens=16)

    assert isinstance(outcome, RequestFailed), outcome
    assert "streamed more than 16 events with text" in str(outcome)
    assert counted <= 16


async def test_as_many_events_as_max_tokens_are_the_answer() -> None:
    outcome, counted = await stream(answer_in_events(16, None), max_tokens=16)

    assert isinstance(outcome, RequestOutcome), outcome
    assert (outcome.output_tokens, counted) == (16, 16)
