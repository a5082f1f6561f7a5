"""The engine's ``/metrics`` as bench reads it: queue depth, KV-cache usage and the prefix
cache's counters, under the names vLLM, SGLang and llama.cpp's server export (the engine
profiles' names, ``wire.engines``, for the queue and the KV cache).

The first name of each list that the scrape contains is used. With several engines in one
scrape (data parallel), waiting requests and counters are summed and the KV-cache usage is
the fullest engine's, the one that saturates first. Samples labelled with another model
than the one benched are left out when any sample carries the benched model's name.
Values no gauge or counter of these can hold (NaN, infinities, negatives) are left out as
the gateway leaves them out: a queue of NaN has no 95th percentile to admit by.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from cli.bench.errors import MetricsUnavailable
from wire.engines import signal_names

WAITING_METRICS = signal_names("waiting")
KV_USAGE_METRICS = signal_names("kv_usage")
PREFIX_HITS_METRICS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES_METRICS = (
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",
)
_MODEL_LABELS = ("model_name", "model")


class EngineReading(msgspec.Struct, frozen=True, kw_only=True):
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None


def read_metrics(text: str, model: str | None = None) -> EngineReading:
    """What bench needs from one scrape. Raises ``MetricsUnavailable`` for text that is not
    the Prometheus format."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not _a_reading(sample.value):
                    continue
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsUnavailable(f"/metrics is not in the Prometheus text format: {exc}") from exc

    def values(names: Sequence[str]) -> list[float] | None:
        for name in names:
            if name in samples:
                return _for_model(samples[name], model)
        return None

    waiting = values(WAITING_METRICS)
    kv_usage = values(KV_USAGE_METRICS)
    hits = values(PREFIX_HITS_METRICS)
    queries = values(PREFIX_QUERIES_METRICS)
    return EngineReading(
        waiting=None if waiting is None else sum(waiting),
        kv_cache_usage=None if not kv_usage else max(kv_usage),
        prefix_cache_hits=None if hits is None else sum(hits),
        prefix_cache_queries=None if queries is None else sum(queries),
    )


def missing_gauges(reading: EngineReading) -> list[str]:
    """What bench needs and the scrape lacked, as the names it looked for: the waiting
    queue. KV-cache usage is not needed: an engine without its gauge (llama.cpp's server)
    is admitted by its queue alone, and bench recommends no KV ceiling for it."""
    if reading.waiting is None:
        return ["the waiting queue (" + ", ".join(WAITING_METRICS) + ")"]
    return []


def prefix_cache_hit_rate(before: EngineReading, after: EngineReading) -> float | None:
    """Prompt tokens the prefix cache answered over those looked up between two scrapes."""
    hits_before, hits_after = before.prefix_cache_hits, after.prefix_cache_hits
    queries_before, queries_after = before.prefix_cache_queries, after.prefix_cache_queries
    if hits_before is None or hits_after is None:
        return None
    if queries_before is None or queries_after is None or queries_after <= queries_before:
        return None
    return (hits_after - hits_before) / (queries_after - queries_before)


def _a_reading(value: float) -> bool:
    """Whether ``value`` can be a queue length, a usage or a count: finite, not below 0."""
    return math.isfinite(value) and value >= 0.0


def _for_model(labelled: list[tuple[dict[str, str], float]], model: str | None) -> list[float]:
    if model is not None:
        mine = [value for labels, value in labelled if _model_of(labels) == model]
        if mine:
            return mine
    return [value for _, value in labelled]


def _model_of(labels: dict[str, str]) -> str | None:
    for label in _MODEL_LABELS:
        if label in labels:
            return labels[label]
    return None
