"""The Prometheus text the simulator serves."""

from __future__ import annotations

import pytest

from agent.simulator.metrics import EngineMetrics, GaugeReadings, Histogram, render


def samples(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    histogram = Histogram([0.1, 1.0])
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)

    assert histogram.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert histogram.sum == pytest.approx(3.65)


def test_metrics_carry_vllm_names_and_labels() -> None:
    metrics = EngineMetrics()
    metrics.prefix_cache_queries = 64
    metrics.prefix_cache_hits = 32
    metrics.requests_aborted = 1
    metrics.time_to_first_token.observe(0.03)

    text = render(
        metrics, GaugeReadings(num_waiting=3, num_running=2, kv_cache_usage=0.25), 'my "model"'
    )

    labels = 'engine="0",model_name="my \\"model\\""'
    values = samples(text)
    assert values[f"vllm:num_requests_waiting{{{labels}}}"] == 3
    assert values[f"vllm:num_requests_running{{{labels}}}"] == 2
    assert values[f"vllm:kv_cache_usage_perc{{{labels}}}"] == 0.25
    assert values[f"vllm:prefix_cache_queries_total{{{labels}}}"] == 64
    assert values[f"vllm:prefix_cache_hits_total{{{labels}}}"] == 32
    assert values[f'vllm:request_success_total{{{labels},finished_reason="length"}}'] == 0
    assert values[f"llmgw_sim:requests_aborted_total{{{labels}}}"] == 1
    assert values[f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.04"}}'] == 1
    assert values[f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.02"}}'] == 0
    assert values[f"vllm:time_to_first_token_seconds_count{{{labels}}}"] == 1
    for histogram in (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert f"# TYPE {histogram} histogram" in text
        assert values[f"{histogram}_count{{{labels}}}"] == 0


def test_as_llamacpp_samples_carry_no_labels_and_there_is_no_kv_gauge() -> None:
    gauges = GaugeReadings(num_waiting=3, num_running=2, kv_cache_usage=0.25)

    values = samples(render(EngineMetrics(), gauges, "m", "llamacpp"))

    assert values["llamacpp:requests_deferred"] == 3
    assert values["llamacpp:requests_processing"] == 2
    assert not any("kv" in name or "{" in name for name in values)


def test_as_sglang_gauges_carry_sglangs_names_and_the_model_label() -> None:
    gauges = GaugeReadings(num_waiting=3, num_running=2, kv_cache_usage=0.25)

    values = samples(render(EngineMetrics(), gauges, "m", "sglang"))

    assert values['sglang:num_queue_reqs{model_name="m"}'] == 3
    assert values['sglang:num_running_reqs{model_name="m"}'] == 2
    assert values['sglang:token_usage{model_name="m"}'] == 0.25
    assert not any(name.startswith("vllm:") for name in values)
