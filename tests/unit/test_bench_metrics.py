"""Reading queue depth, KV-cache usage and the prefix cache's counters from /metrics."""

from __future__ import annotations

import pytest

from agent.simulator.metrics import EngineMetrics, GaugeReadings, SimulatedProfile, render
from cli.bench.errors import MetricsUnavailable
from cli.bench.metrics import EngineReading, missing_gauges, prefix_cache_hit_rate, read_metrics


def simulator_scrape(*, waiting: int, kv: float, hits: int = 0, queries: int = 0) -> str:
    metrics = EngineMetrics()
    metrics.prefix_cache_hits = hits
    metrics.prefix_cache_queries = queries
    gauges = GaugeReadings(num_waiting=waiting, num_running=3, kv_cache_usage=kv)
    return render(metrics, gauges, "llama")


def test_the_simulator_is_read_under_vllms_names() -> None:
    reading = read_metrics(simulator_scrape(waiting=4, kv=0.5, hits=30, queries=120), "llama")

    assert reading == EngineReading(
        waiting=4, kv_cache_usage=0.5, prefix_cache_hits=30, prefix_cache_queries=120
    )
    assert missing_gauges(reading) == []


def test_sglang_names_are_read_too() -> None:
    text = (
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="qwen"} 7\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{model_name="qwen"} 0.25\n'
    )

    reading = read_metrics(text, "qwen")

    assert (reading.waiting, reading.kv_cache_usage) == (7, 0.25)
    assert reading.prefix_cache_hits is None


@pytest.mark.parametrize("profile", ["sglang", "llamacpp"])
def test_the_simulator_under_another_profile_is_read_by_its_names(
    profile: SimulatedProfile,
) -> None:
    gauges = GaugeReadings(num_waiting=5, num_running=3, kv_cache_usage=0.5)
    reading = read_metrics(render(EngineMetrics(), gauges, "llama", profile), "llama")

    assert reading.waiting == 5
    # llama.cpp's server has no KV-cache gauge: bench says which names it looked for.
    assert reading.kv_cache_usage == (None if profile == "llamacpp" else 0.5)


def test_engines_of_one_scrape_add_their_queues_and_the_fullest_cache_counts() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3\n'
        'vllm:num_requests_waiting{engine="0",model_name="other"} 50\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7\n'
    )

    reading = read_metrics(text, "m")

    assert (reading.waiting, reading.kv_cache_usage) == (5, 0.7)


def test_samples_of_an_unnamed_model_count_when_none_carries_the_benched_name() -> None:
    reading = read_metrics(simulator_scrape(waiting=2, kv=0.1), "served-under-another-name")

    assert (reading.waiting, reading.kv_cache_usage) == (2, 0.1)


def test_a_scrape_without_the_gauges_says_which_names_were_looked_for() -> None:
    reading = read_metrics(
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"
    )

    missing = missing_gauges(reading)

    assert len(missing) == 1
    assert "vllm:num_requests_waiting" in missing[0]
    assert "llamacpp:requests_deferred" in missing[0]


def test_a_scrape_with_a_queue_and_no_kv_gauge_is_enough() -> None:
    """llama.cpp's server has no KV-cache gauge: bench goes by its queue."""
    reading = read_metrics(
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 2\n"
    )

    assert (reading.waiting, reading.kv_cache_usage) == (2, None)
    assert missing_gauges(reading) == []


def test_text_that_is_not_prometheus_is_refused() -> None:
    with pytest.raises(MetricsUnavailable, match="Prometheus text format"):
        read_metrics("<html><body>Not here</body></html>")


def test_the_hit_rate_is_hits_over_queries_between_two_scrapes() -> None:
    before = EngineReading(prefix_cache_hits=100, prefix_cache_queries=400)
    after = EngineReading(prefix_cache_hits=400, prefix_cache_queries=800)

    assert prefix_cache_hit_rate(before, after) == pytest.approx(0.75)
    assert prefix_cache_hit_rate(before, before) is None
    assert prefix_cache_hit_rate(EngineReading(), after) is None


@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf", "-3"])
def test_a_value_no_gauge_can_hold_is_skipped_and_the_other_engines_count(odd: str) -> None:
    """A queue of NaN or infinity has no ceiling to take from it: left in, it turned the
    recommendation into a crash (ceil of NaN) or a NaN KV ceiling. The gateway skips such
    samples too."""
    text = (
        f'vllm:num_requests_waiting{{engine="0"}} {odd}\n'
        'vllm:num_requests_waiting{engine="1"} 3\n'
        f'vllm:kv_cache_usage_perc{{engine="0"}} {odd}\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.4\n'
    )

    reading = read_metrics(text)

    assert (reading.waiting, reading.kv_cache_usage) == (3, 0.4)


def test_a_scrape_whose_only_queue_value_is_nan_has_no_queue() -> None:
    reading = read_metrics("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc NaN\n")

    assert (reading.waiting, reading.kv_cache_usage) == (None, None)
    assert missing_gauges(reading) != []
