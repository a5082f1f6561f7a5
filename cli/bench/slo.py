"""Latency targets as an operator writes them (``ttft_p95=500ms``), and the verdict on a
level.

A target names a latency (``ttft`` time to first token, ``tpot`` time per output token,
``e2e`` end to end), a percentile (50, 90, 95, 99) and a limit with its unit (``us``,
``ms``, ``s``, ``m``). A level meets the SLO when every target holds and the share of
requests that succeeded is at least the minimum success rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal, get_args

import msgspec

from cli.bench.stats import LevelFigures, Percentiles

Latency = Literal["ttft", "tpot", "e2e"]
LATENCIES: tuple[Latency, ...] = get_args(Latency)
PERCENTILES = (50, 90, 95, 99)
_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|m)\s*$")
_TARGET = re.compile(r"^\s*([a-z0-9]+)_p(\d+)\s*=\s*(.+)$")


MAX_DURATION_S = 86_400.0
"""The longest duration bench takes (a level's warm-up or measure, a request's timeout, a
latency limit): a day. Digits enough read as an infinite number of seconds, which ended
bench in a traceback when it planned the climb; a finite one years long is no less a slip."""


class SloError(ValueError):
    """A target, duration or rate that cannot be read; the message says how to write it."""


class SloTarget(msgspec.Struct, frozen=True, kw_only=True):
    latency: Latency
    percentile: int
    limit_s: float

    @property
    def key(self) -> str:
        return f"{self.latency}_p{self.percentile}"

    def describe(self) -> str:
        return f"{self.key} <= {format_seconds(self.limit_s)}"


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in ``text``, such as ``500ms``, ``1.5s``, ``2m``; the unit is required, and
    ``MAX_DURATION_S`` the most."""
    match = _DURATION.match(text)
    if match is None:
        raise SloError(f"{what} {text!r}: write a number and a unit, such as 500ms, 1.5s or 2m")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not seconds <= MAX_DURATION_S:
        raise SloError(f"{what} {text!r}: at most a day (1440m)")
    return seconds


def parse_fraction(text: str, what: str) -> float:
    """``99%`` or ``0.99`` as 0.99."""
    stripped = text.strip()
    try:
        value = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise SloError(f"{what} {text!r}: write a percentage (99%) or a fraction (0.99)") from None
    if not 0 <= value <= 1 or math.isnan(value):
        raise SloError(f"{what} {text!r}: must lie between 0% and 100%")
    return value


def parse_target(text: str) -> SloTarget:
    match = _TARGET.match(text.lower())
    if match is None:
        raise SloError(
            f"--slo {text!r}: write LATENCY_pN=LIMIT, such as ttft_p95=500ms, tpot_p95=50ms "
            "or e2e_p99=10s"
        )
    latency, percentile, limit = match.groups()
    if latency not in LATENCIES:
        raise SloError(f"--slo {text!r}: the latency is one of {', '.join(LATENCIES)}")
    if int(percentile) not in PERCENTILES:
        raise SloError(
            f"--slo {text!r}: the percentile is one of " + ", ".join(f"p{p}" for p in PERCENTILES)
        )
    limit_s = parse_duration(limit, f"--slo {text!r}:")
    if limit_s <= 0:
        raise SloError(f"--slo {text!r}: the limit must be more than zero")
    return SloTarget(latency=latency, percentile=int(percentile), limit_s=limit_s)


def parse_targets(texts: Sequence[str]) -> tuple[SloTarget, ...]:
    targets = tuple(parse_target(text) for text in texts)
    keys = [target.key for target in targets]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise SloError(f"--slo {', '.join(duplicates)} given more than once")
    return targets


def breaches(
    targets: Sequence[SloTarget], min_success_rate: float, level: LevelFigures
) -> list[str]:
    """Why ``level`` misses the SLO, one line per target; empty when it meets it."""
    missed: list[str] = []
    if level.ended_early:
        missed.append(f"every request failed: the level stopped after {level.errors}")
    elif level.success_rate < min_success_rate:
        missed.append(
            f"success rate {level.success_rate:.1%} < {min_success_rate:.1%} "
            f"({level.errors} of {level.requests} requests failed)"
        )
    for target in targets:
        observed = _observed(level, target)
        if observed is None:
            missed.append(f"{target.key}: no request finished to measure it")
        elif observed > target.limit_s:
            missed.append(
                f"{target.key} {format_seconds(observed)} > {format_seconds(target.limit_s)}"
            )
    return missed


def _observed(level: LevelFigures, target: SloTarget) -> float | None:
    figures: Percentiles | None = {
        "ttft": level.ttft_s,
        "tpot": level.tpot_s,
        "e2e": level.e2e_s,
    }[target.latency]
    return None if figures is None else figures.at(target.percentile)


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"
