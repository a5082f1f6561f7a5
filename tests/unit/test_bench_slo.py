"""Latency targets as operators write them, and the verdict on a level."""

from __future__ import annotations

import msgspec
import pytest

from cli.bench.slo import (
    SloError,
    SloTarget,
    breaches,
    parse_duration,
    parse_fraction,
    parse_target,
    parse_targets,
)
from cli.bench.stats import LevelFigures, percentiles


def level(*, ttft: list[float], errors: int = 0, tpot: list[float] | None = None) -> LevelFigures:
    succeeded = len(ttft)
    requests = succeeded + errors
    return LevelFigures(
        concurrency=4,
        window_s=1.0,
        requests=requests,
        succeeded=succeeded,
        errors=errors,
        success_rate=succeeded / requests if requests else 0.0,
        requests_per_s=1.0,
        output_tokens_per_s=10.0,
        ttft_s=percentiles(ttft),
        tpot_s=percentiles(tpot or []),
        e2e_s=percentiles([t * 2 for t in ttft]),
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("250us", 250e-6),
        (" 10 s ", 10.0),
        (".5s", 0.5),
    ],
)
def test_durations_need_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["500", "ms", "1.5 h", "-1s", "fast"])
def test_a_duration_without_a_known_unit_says_how_to_write_one(text: str) -> None:
    with pytest.raises(SloError, match=r"500ms, 1\.5s or 2m"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["1" + "0" * 400 + "s", "1441m", "86400.001s"])
def test_a_duration_over_a_day_is_refused(text: str) -> None:
    # Before, 400 digits read as an infinite number of seconds: bench ended in a traceback
    # (OverflowError) as it planned the climb.
    with pytest.raises(SloError) as refused:
        parse_duration(text, "--duration")
    assert str(refused.value) == f"--duration {text!r}: at most a day (1440m)"


def test_a_duration_of_a_day_is_taken() -> None:
    assert (parse_duration("1440m"), parse_duration("86400s")) == (86_400.0, 86_400.0)


def test_a_target_names_a_latency_a_percentile_and_a_limit() -> None:
    assert parse_target("ttft_p95=500ms") == SloTarget(latency="ttft", percentile=95, limit_s=0.5)
    assert parse_target("E2E_P99 = 10s") == SloTarget(latency="e2e", percentile=99, limit_s=10.0)
    assert parse_target("tpot_p50=50ms").describe() == "tpot_p50 <= 50 ms"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("ttft=500ms", "LATENCY_pN=LIMIT"),
        ("itl_p95=5ms", "ttft, tpot, e2e"),
        ("ttft_p97=5ms", "p50, p90, p95, p99"),
        ("ttft_p95=5", "unit"),
        ("ttft_p95=0s", "more than zero"),
    ],
)
def test_a_malformed_target_is_refused_with_the_way_to_write_it(text: str, complaint: str) -> None:
    with pytest.raises(SloError, match=complaint):
        parse_target(text)


def test_the_same_target_twice_is_refused() -> None:
    with pytest.raises(SloError, match="ttft_p95 given more than once"):
        parse_targets(["ttft_p95=1s", "tpot_p95=1s", "ttft_p95=2s"])


@pytest.mark.parametrize(("text", "value"), [("99%", 0.99), ("0.9", 0.9), ("100%", 1.0)])
def test_rates_are_percentages_or_fractions(text: str, value: float) -> None:
    assert parse_fraction(text, "--min-success") == pytest.approx(value)


@pytest.mark.parametrize("text", ["101%", "1.5", "most", "nan"])
def test_a_rate_outside_zero_to_one_is_refused(text: str) -> None:
    with pytest.raises(SloError, match="--min-success"):
        parse_fraction(text, "--min-success")


def test_a_level_within_every_target_meets_the_slo() -> None:
    targets = parse_targets(["ttft_p95=100ms", "e2e_p99=1s"])

    assert breaches(targets, 0.99, level(ttft=[0.05] * 20)) == []


def test_each_missed_target_is_one_reason() -> None:
    targets = parse_targets(["ttft_p95=100ms", "e2e_p50=150ms"])

    reasons = breaches(targets, 0.99, level(ttft=[0.05] * 10 + [0.3] * 10))

    assert reasons == ["ttft_p95 300 ms > 100 ms", "e2e_p50 350 ms > 150 ms"]


def test_failed_requests_break_the_slo_through_the_success_rate() -> None:
    targets = parse_targets(["ttft_p95=1s"])

    reasons = breaches(targets, 0.99, level(ttft=[0.01] * 98, errors=2))

    assert reasons == ["success rate 98.0% < 99.0% (2 of 100 requests failed)"]


def test_a_latency_nobody_measured_cannot_meet_its_target() -> None:
    targets = parse_targets(["tpot_p95=10ms"])

    assert breaches(targets, 0.0, level(ttft=[0.01])) == [
        "tpot_p95: no request finished to measure it"
    ]


def test_a_level_stopped_for_failing_whole_says_so_before_anything_else() -> None:
    failed_whole = msgspec.structs.replace(level(ttft=[], errors=20), ended_early=True)

    missed = breaches(parse_targets(["ttft_p95=1s"]), 0.99, failed_whole)

    assert missed == [
        "every request failed: the level stopped after 20",
        "ttft_p95: no request finished to measure it",
    ]
