"""Routing settings from what the engine showed at the capacity level and the levels
below it that met the SLO."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.bench.recommend import NoRecommendation, recommend
from cli.bench.stats import LevelFigures, percentiles


def capacity_level(
    waiting: list[float], kv: list[float], tokens_per_s: float = 1234.0
) -> LevelFigures:
    return LevelFigures(
        concurrency=24,
        window_s=10.0,
        requests=100,
        succeeded=100,
        errors=0,
        success_rate=1.0,
        requests_per_s=5.0,
        output_tokens_per_s=tokens_per_s,
        waiting=percentiles(waiting),
        kv_cache_usage=percentiles(kv),
        slo_met=True,
    )


def test_the_settings_follow_the_documented_formulas() -> None:
    waiting = [0, 1, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 6, 7, 7, 12]
    kv = [0.40, 0.52, 0.61, 0.66, 0.71]

    recommendation = recommend(capacity_level(waiting, kv, tokens_per_s=1234.0))

    assert recommendation.concurrency == 24
    observed = percentiles(waiting)
    assert observed is not None
    assert recommendation.target_waiting == math.ceil(observed.p95) == 8
    assert recommendation.kv_ceiling == 0.71
    assert recommendation.weight == 12.3


def test_an_engine_that_never_queued_gets_the_smallest_target_the_gateway_accepts() -> None:
    recommendation = recommend(capacity_level([0, 0, 0], [0.2, 0.3]))

    assert recommendation.target_waiting == 1


def test_a_lower_level_that_queued_more_within_the_slo_raises_the_target() -> None:
    """The gateway admits while waiting < target_waiting: a target below the queue the
    replica served within the SLO would throttle it, as a KV ceiling below its use would."""
    capacity = capacity_level([2, 3, 4, 4], [0.6, 0.7])
    noisier = msgspec.structs.replace(
        capacity_level([3, 5, 6, 7], [0.5]), concurrency=16, slo_met=True
    )
    broken = msgspec.structs.replace(capacity_level([30, 40], [0.9]), concurrency=32, slo_met=False)

    recommendation = recommend(capacity, [noisier, broken])

    assert recommendation.target_waiting == 7
    assert recommendation.kv_ceiling == 0.7


def test_without_queue_samples_there_is_no_recommendation() -> None:
    with pytest.raises(NoRecommendation, match="no queue sample"):
        recommend(capacity_level([], [0.5]))


def test_an_engine_without_a_kv_gauge_gets_no_ceiling_and_is_admitted_by_its_queue() -> None:
    """llama.cpp's server: queue samples, not one of KV-cache usage."""
    recommendation = recommend(capacity_level([0, 1, 2, 3], []))

    assert recommendation.kv_ceiling == 1.0
    assert recommendation.target_waiting == 3


def test_an_engine_that_reports_no_kv_use_gives_no_ceiling() -> None:
    with pytest.raises(NoRecommendation, match="empty KV cache"):
        recommend(capacity_level([1, 2], [0.0, 0.0]))


@given(
    waiting=st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=200),
    kv=st.lists(st.floats(min_value=0.001, max_value=1.0), min_size=1, max_size=200),
    tokens_per_s=st.floats(min_value=0.01, max_value=1e6),
)
def test_the_settings_lie_within_what_was_observed_and_the_gateway_accepts(
    waiting: list[int], kv: list[float], tokens_per_s: float
) -> None:
    recommendation = recommend(capacity_level([float(w) for w in waiting], kv, tokens_per_s))

    assert min(waiting) <= recommendation.target_waiting <= max(waiting)
    assert min(kv) <= recommendation.kv_ceiling <= max(kv)
    assert 0 < recommendation.kv_ceiling <= 1
    assert recommendation.weight > 0
    assert recommendation.weight == pytest.approx(max(tokens_per_s / 100, 0.001), rel=0.01)
