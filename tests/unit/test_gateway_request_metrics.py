"""The gateway's request figures, counted without prometheus_client's locks, read at a scrape
as prometheus_client's own Counter and Histogram would show them."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from app.gateway.metrics import ADDED_BUCKETS, GatewayMetrics


def scraped(metrics: GatewayMetrics) -> dict[str, float]:
    """Every sample of the page by its series, ``_created`` left out (a clock's reading)."""
    values: dict[str, float] = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    return values


def test_a_scrape_after_n_requests_counts_n() -> None:
    metrics = GatewayMetrics()
    for _ in range(37):
        metrics.answered(
            "llama", 200, duration_s=0.02, added_s=0.0003, first_byte_s=0.01, queue_s=0.0
        )
    metrics.answered("llama", 429, duration_s=0.001, added_s=0.001, first_byte_s=None, queue_s=None)
    page = scraped(metrics)
    assert page['llmgw_gateway_requests_total{model="llama",status="200"}'] == 37
    assert page['llmgw_gateway_requests_total{model="llama",status="429"}'] == 1
    assert page['llmgw_gateway_request_duration_seconds_count{model="llama"}'] == 38
    assert page['llmgw_gateway_request_duration_seconds_bucket{le="0.025",model="llama"}'] == 38
    assert page['llmgw_gateway_request_duration_seconds_bucket{le="0.01",model="llama"}'] == 1
    assert page['llmgw_gateway_time_to_first_byte_seconds_count{model="llama"}'] == 37
    assert page['llmgw_gateway_queue_seconds_count{model="llama"}'] == 37
    assert page['llmgw_gateway_added_seconds_sum{model="llama"}'] == 37 * 0.0003 + 0.001


def test_each_series_has_its_created_time_as_prometheus_client_writes_it() -> None:
    metrics = GatewayMetrics()
    metrics.answered("m", 200, duration_s=1, added_s=0, first_byte_s=None, queue_s=None)
    page = metrics.render().decode()
    for series in (
        'llmgw_gateway_requests_created{model="m",status="200"}',
        'llmgw_gateway_request_duration_seconds_created{model="m"}',
        'llmgw_gateway_queue_seconds_created{model="m"}',
    ):
        assert re.search(re.escape(series) + r" \d\.\d+e\+09\n", page), series


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", ""]),
            st.sampled_from([200, 429, 499, 500]),
            st.sampled_from([*ADDED_BUCKETS, 0.0, 2.0]) | st.floats(0, 5),
        ),
        max_size=40,
    )
)
def test_the_page_is_what_prometheus_clients_own_counter_and_histogram_would_write(
    requests: list[tuple[str, int, float]],
) -> None:
    metrics = GatewayMetrics()
    registry = CollectorRegistry()
    counter = Counter("llmgw_gateway_requests", "x", ["model", "status"], registry=registry)
    added = Histogram(
        "llmgw_gateway_added_seconds", "x", ["model"], buckets=ADDED_BUCKETS, registry=registry
    )
    for model, status, seconds in requests:
        metrics.answered(
            model, status, duration_s=seconds, added_s=seconds, first_byte_s=None, queue_s=None
        )
        counter.labels(model, str(status)).inc()
        added.labels(model).observe(seconds)
    expected = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#") and "_created" not in line
    }
    page = scraped(metrics)
    assert {series: page[series] for series in expected} == expected


def test_the_series_of_models_removed_go_and_those_declared_stay() -> None:
    """A gateway that runs for months while models come and go publishes the models there
    are, not every model it ever served."""
    metrics = GatewayMetrics()
    for n in range(1000):
        model = f"m-{n}"
        metrics.answered(model, 200, duration_s=1, added_s=0, first_byte_s=0.5, queue_s=0)
        metrics.usage_unusable(model)
    metrics.answered("", 404, duration_s=0.001, added_s=0.001, first_byte_s=None, queue_s=None)
    metrics.keep_models(frozenset({"m-7", "m-new"}))
    page = metrics.render().decode()
    models = set(re.findall(r'model="([^"]*)"', page))
    assert models == {"m-7", ""}, sorted(models)[:5]
    assert scraped(metrics)['llmgw_gateway_requests_total{model="m-7",status="200"}'] == 1
    metrics.answered("m-3", 200, duration_s=1, added_s=0, first_byte_s=None, queue_s=None)
    assert scraped(metrics)['llmgw_gateway_requests_total{model="m-3",status="200"}'] == 1, (
        "a model declared again starts over"
    )


def test_a_status_the_gateway_does_not_answer_itself_is_counted_under_its_class() -> None:
    """Whatever statuses an engine makes up, a model has at most a series per status the
    gateway answers itself and one per class: an engine's 201, 418 and 507 are ``2xx``,
    ``4xx`` and ``5xx``, the gateway's own 429, 499 and 503 keep their numbers."""
    metrics = GatewayMetrics()
    for status in range(100, 600):
        metrics.answered("m", status, duration_s=1, added_s=0, first_byte_s=None, queue_s=None)
    metrics.answered("m", 503, duration_s=1, added_s=0, first_byte_s=None, queue_s=None)

    page = scraped(metrics)
    statuses = set(
        re.findall(r'llmgw_gateway_requests_total\{model="m",status="([^"]*)"\}', "\n".join(page))
    )

    own = {200, 400, 401, 404, 405, 408, 413, 429, 431, 499, 500, 502, 503, 504}
    assert statuses == {*(str(status) for status in own), "1xx", "2xx", "3xx", "4xx", "5xx"}
    assert page['llmgw_gateway_requests_total{model="m",status="2xx"}'] == 99  # 201..299
    # 400..499 but the 9 the gateway answers itself
    assert page['llmgw_gateway_requests_total{model="m",status="4xx"}'] == 100 - 9
    assert page['llmgw_gateway_requests_total{model="m",status="503"}'] == 2
    assert page['llmgw_gateway_requests_total{model="m",status="499"}'] == 1
