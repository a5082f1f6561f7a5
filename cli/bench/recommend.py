"""Routing settings from the capacity level: what the engine showed while it still met the
SLO is what admission should treat as healthy.

The gateway sends a replica new work while ``waiting < target_waiting`` and
``kv_usage < kv_ceiling``, and shares traffic among replicas by ``weight``:

    target_waiting = max(1, ceil(the highest p95 of the waiting samples at a level that
                                 met the SLO))
    kv_ceiling     = the highest KV-cache usage sampled at any level that met the SLO
    weight         = output tokens/s at capacity / 100, to 3 significant digits

Both limits count what was seen at the capacity level and at any lower level that met the
SLO: levels are noisy, and a limit below what the engine was seen to serve within the SLO
would turn healthy work away. The queue is bursty, so one high sample must not set its
limit: each level's 95th percentile does. KV-cache usage moves slowly and is bounded by 1,
so its whole range counts. ``target_waiting`` is at least 1 because the gateway needs a queue
of at least one to send anything; when the engine never queued at capacity, any queue at
all means more load than it could serve. The weight is 1 per 100 output tokens/s, so
replicas of one model benched with the same input and output lengths compare directly,
and a replica with twice the throughput takes twice the traffic.

Only a level the next one broke is a capacity: when the climb stopped at
--max-concurrency with the SLO still met, the queue and KV use at its top level are what
the engine showed with room to spare, not its limits, and admission built on them would
throttle a healthy replica. The report then recommends nothing (``lower_bound_note``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def lower_bound_note(max_concurrency: int) -> str:
    """Why a climb that stopped at ``max_concurrency`` within the SLO recommends nothing."""
    return (
        f"the capacity was not reached within --max-concurrency {max_concurrency}: every "
        "level met the SLO, so the queue and KV-cache use seen are not the engine's limits; "
        "raise --max-concurrency until a level breaks the SLO"
    )


def recommend(capacity: LevelFigures, within_slo: Sequence[LevelFigures] = ()) -> Recommendation:
    """Settings from ``capacity``, the highest level that met the SLO below one that broke
    it; ``within_slo``, the other levels that met it, only ever raise the limits."""
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
        seen_within_slo = [
            figures.kv_cache_usage.max
            for figures in (capacity, *within_slo)
            if figures.slo_met and figures.kv_cache_usage is not None
        ]
        kv_ceiling = min(max(seen_within_slo, default=capacity.kv_cache_usage.max), 1.0)
    queued_within_slo = [
        figures.waiting.p95
        for figures in (capacity, *within_slo)
        if figures.slo_met and figures.waiting is not None
    ]
    if capacity.output_tokens_per_s <= 0:
        raise NoRecommendation(f"no output token arrived in the window at concurrency {level}")
    return Recommendation(
        concurrency=level,
        weight=max(_significant(capacity.output_tokens_per_s / WEIGHT_TOKENS_PER_S), MIN_WEIGHT),
        target_waiting=max(1, math.ceil(max(queued_within_slo, default=0.0) - 1e-9)),
        kv_ceiling=kv_ceiling,
    )


def _significant(value: float, digits: int = 3) -> float:
    if value <= 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(value)))
