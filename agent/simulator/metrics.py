"""The simulator's Prometheus metrics, under the names and labels of the engine profile it
plays (``--profile``; vLLM's by default).

Written by hand in the Prometheus text format (version 0.0.4) because the set is small
and fixed. As vLLM (the default) counters carry the ``_total`` suffix in their ``# TYPE``
line as vLLM's exporter writes them, histograms use vLLM's buckets, and every sample
carries ``model_name`` and ``engine="0"``. As SGLang, the queue, running and token-usage
gauges, the token counters and the latency histograms take ``sglang:`` names and a
``model_name`` label. As llama.cpp's server, samples have no labels and there is no
KV-cache gauge and no histogram, as in its current builds. The gauges' names are the
profile's own (``wire.engines``), so what the simulator says is what llmgw reads.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Literal

from wire.engines import LLAMACPP, SGLANG, VLLM, EngineProfile

SimulatedProfile = Literal["vllm", "sglang", "llamacpp"]
SIMULATED_PROFILES: dict[str, EngineProfile] = {
    "vllm": VLLM,
    "sglang": SGLANG,
    "llamacpp": LLAMACPP,
}

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class Histogram:
    __slots__ = ("_bounds", "_counts", "count", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        rows: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip(self._bounds, self._counts, strict=False):
            running += count
            rows.append((repr(float(bound)), running))
        rows.append(("+Inf", self.count))
        return rows


class EngineMetrics:
    """Counters and histograms the engine updates; gauges are read at scrape time."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_succeeded = 0
        self.requests_aborted = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.time_to_first_token = Histogram(TTFT_BUCKETS)
        self.inter_token_latency = Histogram(INTER_TOKEN_BUCKETS)
        self.e2e_request_latency = Histogram(E2E_BUCKETS)


class GaugeReadings:
    __slots__ = ("kv_cache_usage", "num_running", "num_waiting")

    def __init__(self, *, num_waiting: int, num_running: int, kv_cache_usage: float) -> None:
        self.num_waiting = num_waiting
        self.num_running = num_running
        self.kv_cache_usage = kv_cache_usage


def render(
    metrics: EngineMetrics,
    gauges: GaugeReadings,
    model_name: str,
    profile: SimulatedProfile = "vllm",
) -> str:
    renderer = {"vllm": _render_vllm, "sglang": _render_sglang, "llamacpp": _render_llamacpp}
    return renderer[profile](metrics, gauges, model_name)


def _render_vllm(metrics: EngineMetrics, gauges: GaugeReadings, model_name: str) -> str:
    exposition = _Exposition(f'engine="0",model_name="{_escape(model_name)}"')
    sample, histogram = exposition.sample, exposition.histogram
    sample(VLLM.metrics.running[0], "gauge", "Requests in the running batch.", gauges.num_running)
    sample(VLLM.metrics.waiting[0], "gauge", "Requests waiting to be admitted.", gauges.num_waiting)
    sample(
        VLLM.metrics.kv_usage[0],
        "gauge",
        "Fraction of KV-cache blocks in use (1 means full).",
        gauges.kv_cache_usage,
    )
    sample(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        metrics.prefix_cache_queries,
    )
    sample(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        metrics.prefix_cache_hits,
    )
    sample(
        "vllm:request_success_total",
        "counter",
        "Requests that finished.",
        metrics.requests_succeeded,
        'finished_reason="length"',
    )
    sample(
        "vllm:prompt_tokens_total", "counter", "Prefill tokens processed.", metrics.prompt_tokens
    )
    sample(
        "vllm:generation_tokens_total",
        "counter",
        "Generation tokens processed.",
        metrics.generation_tokens,
    )
    sample(
        "llmgw_sim:requests_aborted_total",
        "counter",
        "Requests aborted because their client went away.",
        metrics.requests_aborted,
    )
    histogram(
        "vllm:time_to_first_token_seconds",
        "Time to first token in seconds.",
        metrics.time_to_first_token,
    )
    histogram(
        "vllm:inter_token_latency_seconds",
        "Time between output tokens in seconds.",
        metrics.inter_token_latency,
    )
    histogram(
        "vllm:time_per_output_token_seconds",
        "Time per output token in seconds (same samples as the inter-token latency).",
        metrics.inter_token_latency,
    )
    histogram(
        "vllm:e2e_request_latency_seconds",
        "End-to-end request latency in seconds.",
        metrics.e2e_request_latency,
    )
    return exposition.text()


def _render_sglang(metrics: EngineMetrics, gauges: GaugeReadings, model_name: str) -> str:
    exposition = _Exposition(f'model_name="{_escape(model_name)}"')
    sample = exposition.sample
    sample(
        SGLANG.metrics.running[0], "gauge", "The number of running requests.", gauges.num_running
    )
    sample(
        SGLANG.metrics.waiting[0],
        "gauge",
        "The number of requests in the waiting queue.",
        gauges.num_waiting,
    )
    sample(SGLANG.metrics.kv_usage[0], "gauge", "The token usage.", gauges.kv_cache_usage)
    sample(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        metrics.prompt_tokens,
    )
    sample(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        metrics.generation_tokens,
    )
    for name, help_text, histogram in (
        (
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            metrics.time_to_first_token,
        ),
        (
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            metrics.inter_token_latency,
        ),
        (
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            metrics.e2e_request_latency,
        ),
    ):
        exposition.histogram(name, help_text, histogram)
    return exposition.text()


def _render_llamacpp(metrics: EngineMetrics, gauges: GaugeReadings, model_name: str) -> str:
    """llama.cpp's server labels nothing (it serves one model) and has no KV-cache gauge."""
    exposition = _Exposition(None)
    sample = exposition.sample
    sample(
        "llamacpp:prompt_tokens_total",
        "counter",
        "Number of prompt tokens processed.",
        metrics.prompt_tokens,
    )
    sample(
        "llamacpp:tokens_predicted_total",
        "counter",
        "Number of generation tokens processed.",
        metrics.generation_tokens,
    )
    sample(
        LLAMACPP.metrics.running[0],
        "gauge",
        "Number of requests processing.",
        gauges.num_running,
    )
    sample(
        LLAMACPP.metrics.waiting[0],
        "gauge",
        "Number of requests deferred.",
        gauges.num_waiting,
    )
    return exposition.text()


class _Exposition:
    """Samples in the text format, each with the same ``labels`` (none when None)."""

    def __init__(self, labels: str | None) -> None:
        self._labels = labels
        self._lines: list[str] = []

    def sample(self, name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
        """``extra``: labels this sample adds to the common ones."""
        self._lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        self._lines.append(f"{name}{self._braces(extra)} {_number(value)}")

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self._lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, count in histogram.cumulative():
            le = f'le="{bound}"'
            self._lines.append(f"{name}_bucket{self._braces(le)} {count}")
        self._lines.append(f"{name}_count{self._braces()} {histogram.count}")
        self._lines.append(f"{name}_sum{self._braces()} {_number(histogram.sum)}")

    def text(self) -> str:
        return "\n".join([*self._lines, ""])

    def _braces(self, extra: str = "") -> str:
        labels = ",".join(label for label in (self._labels, extra) if label)
        return f"{{{labels}}}" if labels else ""


def _number(value: float) -> str:
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
