"""What bench says before it starts: the levels it may measure and the most they may take."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cli.bench.plan import BenchPlan
from cli.bench.progress import format_span, plan_lines
from cli.bench.runner import BenchRun
from cli.bench.slo import parse_targets

DEFAULTS = BenchPlan(
    targets=parse_targets(["ttft_p95=500ms"]),
    min_success_rate=0.99,
    input_tokens=512,
    output_tokens=128,
    max_concurrency=256,
)


def test_the_default_climb_says_it_may_take_fourteen_levels_of_35_seconds() -> None:
    assert plan_lines(BenchRun.planned(DEFAULTS)) == [
        "bench plan: concurrency 1, 2, 4, ... 128, 256, doubling until a level breaks the SLO, "
        "then bisecting to within 5% (never closer than one)",
        "bench plan: at most 14 levels of 5s warm-up + 30s measure: at most 8m10s, plus the "
        "engine checks and each level's wait for its last answers",
    ]


def test_a_request_count_per_level_gives_no_time_it_cannot_know() -> None:
    plan = replace(DEFAULTS, max_requests=200, precision=0.0, max_concurrency=8)

    lines = plan_lines(BenchRun.planned(plan))

    assert lines == [
        "bench plan: concurrency 1, 2, 4, 8, doubling until a level breaks the SLO, then "
        "bisecting to within one",
        "bench plan: at most 6 levels of 5s warm-up + 200 measured requests: no time "
        "estimate: a level takes as long as the engine needs to answer them",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.1, "0.1s"), (1.0, "1s"), (9.96, "10s"), (35.0, "35s"), (490.0, "8m10s"),
     (3599.6, "1h00m"), (3900.0, "1h05m")],
)  # fmt: skip
def test_spans_read_as_an_operator_writes_them(seconds: float, text: str) -> None:
    assert format_span(seconds) == text
