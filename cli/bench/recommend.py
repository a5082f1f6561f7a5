"""Routing settings from the capacity level: what the engine showed while it still met the
SLO is what admission should treat as healthy.

The gateway sends a replica new work while ``waiting < target_waiting`` and
``kv_usage < kv_ceiling``, and shares traffic among replicas by ``weight``:

    target_waiting = max(1, ceil(p95 of the waiting samples at capacity))
    kv_ceiling     = the highest KV-cache usage sampled at capacity
    weight         = output tokens/s at capacity / 100, to 3 significant digits

The queue is bursty, so one high sample must not set its limit: the 95th percentile does.
KV-cache usage moves slowly and is bounded by 1, so the whole range seen while the SLO
held counts as healthy. ``target_waiting`` is at least 1 because the gateway needs a queue
of at least one to send anything; when the engine never queued at capacity, any queue at
all means more load than it could serve. The weight is 1 per 100 output tokens/s, so
replicas of one model benched with the same input and output lengths compare directly,
and a replica with twice the throughput takes twice the traffic.
"""

from __future__ import annotations

import math

import msgspec

from cli.bench.stats import LevelFigures

WEIGHT_TOKENS_PER_S = 100.0
MIN_WEIGHT = 0.001


class NoRecommendation(ValueError):
    """The capacity level lacks what a recommendation needs; the message says what."""


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    concurrency: int
    """The capacity level the settings come from."""
    weight: float
    target_waiting: int
    kv_ceiling: float


def recommend(capacity: LevelFigures) -> Recommendation:
    level = capacity.concurrency
    if capacity.waiting is None:
        raise NoRecommendation(
            f"no queue sample was read from /metrics at concurrency {level}; "
            "lower --sample-interval or lengthen --duration"
        )
    if capacity.kv_cache_usage is None:
        # Queue samples without a single KV one: the engine has no KV-cache gauge (llama.cpp's
        # server). The gateway admits it by its queue alone, so no ceiling: 1, the highest.
        kv_ceiling = 1.0
    elif capacity.kv_cache_usage.max <= 0:
        raise NoRecommendation(
            f"the engine reported an empty KV cache all through concurrency {level}, so there "
            "is no ceiling to learn (does it report kv usage?)"
        )
    else:
        kv_ceiling = min(capacity.kv_cache_usage.max, 1.0)
    if capacity.output_tokens_per_s <= 0:
        raise NoRecommendation(f"no output token arrived in the window at concurrency {level}")
    return Recommendation(
        concurrency=level,
        weight=max(_significant(capacity.output_tokens_per_s / WEIGHT_TOKENS_PER_S), MIN_WEIGHT),
        target_waiting=max(1, math.ceil(capacity.waiting.p95 - 1e-9)),
        kv_ceiling=kv_ceiling,
    )


def _significant(value: float, digits: int = 3) -> float:
    if value <= 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(value)))
