"""Percentiles of what one level measured, and the figures a level reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from cli.bench.metrics import EngineReading, prefix_cache_hit_rate

MAX_ERROR_SAMPLES = 5


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """Linear-interpolation percentiles (numpy's default) of a sample, with its range."""

    count: int
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    mean: float

    def at(self, percentile: int) -> float:
        value: float = getattr(self, f"p{percentile}")
        return value


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``ordered`` (sorted, not empty)."""
    position = (len(ordered) - 1) * fraction
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def percentiles(values: Sequence[float]) -> Percentiles | None:
    if not values:
        return None
    ordered = sorted(values)
    return Percentiles(
        count=len(ordered),
        min=ordered[0],
        p50=percentile(ordered, 0.50),
        p90=percentile(ordered, 0.90),
        p95=percentile(ordered, 0.95),
        p99=percentile(ordered, 0.99),
        max=ordered[-1],
        mean=sum(ordered) / len(ordered),
    )


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One streamed request that finished, as the client saw it."""

    ttft_s: float
    tpot_s: float | None
    """None for an answer of a single token."""
    e2e_s: float
    output_tokens: int
    prompt_tokens: int | None


@dataclass(frozen=True)
class LevelLoad:
    """What the load generator measured at one level."""

    concurrency: int
    window_s: float
    outcomes: Sequence[RequestOutcome]
    """The measured requests that succeeded."""
    errors: Sequence[str]
    """One message per measured request that failed."""
    finished_in_window: int
    output_tokens_in_window: int
    ended_early: bool = False
    """Every request failed and none succeeded, so the level stopped there; ``errors`` then
    holds every request it sent, warm-up included."""


class LevelFigures(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one concurrency level measured, and whether it met the SLO."""

    concurrency: int
    window_s: float
    """How long the measurement window lasted (after the warm-up)."""
    requests: int
    """Requests started in the window (the measured ones)."""
    succeeded: int
    errors: int
    error_samples: list[str] = []
    """Up to a few distinct error messages, as the engine or the connection gave them."""
    success_rate: float
    requests_per_s: float
    """Requests that finished in the window, per second."""
    output_tokens_per_s: float
    """Output tokens received in the window, from every request, per second."""
    mean_output_tokens: float | None = None
    mean_prompt_tokens: float | None = None
    """As the engine counted them (``usage``), when it said."""
    ttft_s: Percentiles | None = None
    tpot_s: Percentiles | None = None
    """Time per output token: a request's decode time over its output tokens after the first."""
    e2e_s: Percentiles | None = None
    waiting: Percentiles | None = None
    """The engine's waiting queue depth, sampled from /metrics during the window."""
    kv_cache_usage: Percentiles | None = None
    """The engine's KV-cache usage (0..1), sampled from /metrics during the window."""
    prefix_cache_hit_rate: float | None = None
    """Prompt tokens the prefix cache answered over prompt tokens looked up, in the level."""
    metric_samples: int = 0
    ended_early: bool = False
    """Every request failed and none succeeded, so the level stopped before its window
    ended, and counts every request it sent."""
    slo_met: bool = False
    breaches: list[str] = []
    """Why the level did not meet the SLO, one line per target missed."""


def summarize(
    load: LevelLoad,
    samples: Sequence[EngineReading],
    before: EngineReading,
    after: EngineReading,
) -> LevelFigures:
    """The figures of one level, not yet judged against the SLO."""
    outcomes = load.outcomes
    requests = len(outcomes) + len(load.errors)
    prompt_counts = [o.prompt_tokens for o in outcomes if o.prompt_tokens is not None]
    return LevelFigures(
        concurrency=load.concurrency,
        window_s=load.window_s,
        requests=requests,
        succeeded=len(outcomes),
        errors=len(load.errors),
        error_samples=list(dict.fromkeys(load.errors))[:MAX_ERROR_SAMPLES],
        success_rate=len(outcomes) / requests if requests else 0.0,
        requests_per_s=_per_second(load.finished_in_window, load.window_s),
        output_tokens_per_s=_per_second(load.output_tokens_in_window, load.window_s),
        mean_output_tokens=_mean([o.output_tokens for o in outcomes]),
        mean_prompt_tokens=_mean(prompt_counts),
        ttft_s=percentiles([o.ttft_s for o in outcomes]),
        tpot_s=percentiles([o.tpot_s for o in outcomes if o.tpot_s is not None]),
        e2e_s=percentiles([o.e2e_s for o in outcomes]),
        waiting=percentiles([s.waiting for s in samples if s.waiting is not None]),
        kv_cache_usage=percentiles(
            [s.kv_cache_usage for s in samples if s.kv_cache_usage is not None]
        ),
        prefix_cache_hit_rate=prefix_cache_hit_rate(before, after),
        metric_samples=len(samples),
        ended_early=load.ended_early,
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per_second(count: int, window_s: float) -> float:
    return count / window_s if window_s > 0 else 0.0
