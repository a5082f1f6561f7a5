"""The report of a bench, complete or cut short: its verdict, the JSON, the chart, the
table, and the summary --apply records."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
from rich.console import Console

from cli.bench.chart import write_chart
from cli.bench.plan import BenchPlan
from cli.bench.report import (
    FAILED,
    INTERRUPTED,
    BenchReport,
    TargetView,
    build_report,
    tuning_summary,
    write_json,
)
from cli.bench.runner import BenchRun
from cli.bench.slo import breaches, parse_targets
from cli.bench.stats import LevelFigures, percentiles
from cli.bench.table import print_report
from cli.bench.target import Engine

STARTED = datetime(2026, 3, 5, 16, 0, tzinfo=UTC)
PLAN = BenchPlan(
    targets=parse_targets(["ttft_p95=300ms"]),
    min_success_rate=0.99,
    input_tokens=64,
    output_tokens=8,
    max_concurrency=64,
    precision=0.0,
)
TARGET = TargetView(
    url="http://127.0.0.7:8001", model=None, replica_id="llama-2", api="completions"
)


def measured(concurrency: int, ttft_s: float, tokens_per_s: float) -> LevelFigures:
    figures = LevelFigures(
        concurrency=concurrency,
        window_s=2.0,
        requests=20,
        succeeded=20,
        errors=0,
        success_rate=1.0,
        requests_per_s=tokens_per_s / 8,
        output_tokens_per_s=tokens_per_s,
        ttft_s=percentiles([ttft_s] * 20),
        tpot_s=percentiles([0.03] * 20),
        e2e_s=percentiles([ttft_s + 0.21] * 20),
        waiting=percentiles([max(concurrency - 4, 0)] * 5),
        kv_cache_usage=percentiles([0.8, 0.83]),
        prefix_cache_hit_rate=0.0,
        metric_samples=5,
    )
    missed = breaches(PLAN.targets, PLAN.min_success_rate, figures)
    return msgspec.structs.replace(figures, slo_met=not missed, breaches=missed)


def run_against(levels: dict[int, tuple[float, float]], plan: BenchPlan = PLAN) -> BenchRun:
    """A run whose climb measured the levels it asked for from ``levels``."""
    run = BenchRun.planned(plan)
    run.engine = Engine("http://127.0.0.7:8001", "llama", ignore_eos=True)
    while (level := run.climb.next_level) is not None and level in levels:
        figures = measured(level, *levels[level])
        run.levels.append(figures)
        run.climb.record(level, passed=figures.slo_met)
    return run


ENGINE = {
    1: (0.03, 30.0),
    2: (0.05, 60.0),
    4: (0.06, 120.0),
    8: (0.27, 133.0),
    16: (0.9, 140.0),
    12: (0.5, 135.0),
    10: (0.5, 134.0),
    9: (0.48, 133.5),
}


def report_of(run: BenchRun, failure: str | None = None) -> BenchReport:
    return build_report(
        run,
        TARGET,
        started_at=STARTED,
        finished_at=STARTED + timedelta(minutes=3),
        failure=failure,
    )


def test_a_finished_climb_reports_capacity_peak_and_a_recommendation() -> None:
    report = report_of(run_against(ENGINE))

    assert report.complete
    assert report.capacity == 8
    assert report.resolution == 1
    assert report.stop_reason == "slo_broken"
    assert report.stop_detail == (
        "concurrency 9 broke the SLO (ttft_p95 480 ms > 300 ms); 8 met it"
    )
    assert report.peak is not None
    assert (report.peak.concurrency, report.peak.slo_met) == (16, False)
    assert report.recommendation is not None
    assert report.recommendation.target_waiting == 4
    assert report.recommendation.kv_ceiling == 0.83
    assert report.recommendation.weight == 1.33
    assert report.target.model == "llama"
    assert report.target.ignore_eos is True


def test_a_climb_cut_short_keeps_its_levels_but_recommends_nothing() -> None:
    run = run_against({1: ENGINE[1], 2: ENGINE[2]})

    report = report_of(run, failure="cannot connect to the engine: connection refused")

    assert [level.concurrency for level in report.levels] == [1, 2]
    assert report.stop_reason == FAILED
    assert report.stop_detail == "cannot connect to the engine: connection refused"
    assert report.recommendation is None
    assert report.recommendation_note == "the bench did not finish, so its capacity is not known"
    assert report_of(run, failure=INTERRUPTED).stop_detail == "interrupted after 2 levels"


def test_a_climb_that_stops_at_max_concurrency_within_the_slo_recommends_no_limits() -> None:
    """Its top level is a lower bound, not the capacity: the queue it never formed and the
    little KV cache it used would make admission throttle a healthy replica."""
    ceiling_plan = dataclasses.replace(PLAN, max_concurrency=4)

    report = report_of(run_against(ENGINE, ceiling_plan))

    assert report.stop_reason == "ceiling"
    assert (report.capacity, report.capacity_is_lower_bound) == (4, True)
    assert report.recommendation is None
    assert report.recommendation_note is not None
    assert "not reached within --max-concurrency 4" in report.recommendation_note
    console = Console(width=200, record=True)
    print_report(report, console)
    assert "no recommendation: the capacity was not reached within --max-concurrency 4" in (
        console.export_text()
    )


def test_the_kv_ceiling_is_never_below_what_a_level_within_the_slo_used() -> None:
    run = run_against(ENGINE)
    fuller_at_4 = msgspec.structs.replace(run.levels[2], kv_cache_usage=percentiles([0.9, 0.95]))
    assert (fuller_at_4.concurrency, fuller_at_4.slo_met) == (4, True)
    run.levels[2] = fuller_at_4

    report = report_of(run)

    assert report.capacity == 8
    assert report.recommendation is not None
    assert report.recommendation.kv_ceiling == 0.95


def test_the_target_waiting_is_never_below_the_queue_a_level_within_the_slo_served() -> None:
    run = run_against(ENGINE)
    queued_at_4 = msgspec.structs.replace(run.levels[2], waiting=percentiles([3, 5, 6]))
    assert (queued_at_4.concurrency, queued_at_4.slo_met) == (4, True)
    run.levels[2] = queued_at_4

    report = report_of(run)

    assert report.capacity == 8
    assert report.recommendation is not None
    assert report.recommendation.target_waiting == 6


def test_when_concurrency_one_breaks_the_report_says_why() -> None:
    report = report_of(run_against({1: (0.5, 30.0)}))

    assert report.stop_reason == "first_level_broken"
    assert report.stop_detail == "even concurrency 1 broke the SLO: ttft_p95 500 ms > 300 ms"
    assert report.capacity == 0
    assert report.recommendation is None


def test_the_json_report_reads_back_whole(tmp_path: Path) -> None:
    report = report_of(run_against(ENGINE))

    write_json(report, tmp_path / "bench.json")

    assert msgspec.json.decode((tmp_path / "bench.json").read_bytes(), type=BenchReport) == report


def test_the_chart_is_a_png(tmp_path: Path) -> None:
    write_chart(report_of(run_against(ENGINE)), tmp_path / "bench.png")
    write_chart(report_of(run_against({1: (0.5, 30.0)})), tmp_path / "one.png")

    for name in ("bench.png", "one.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_table_marks_capacity_and_peak_and_ends_with_the_verdict() -> None:
    console = Console(width=140, record=True)

    print_report(report_of(run_against(ENGINE)), console)

    text = console.export_text()
    assert "cap 8" in text
    assert "peak 16" in text
    assert "capacity: 8 concurrent requests (to within 1)" in text
    assert "recommended: weight 1.33, target_waiting 4, kv_ceiling 0.83" in text


def test_an_error_every_level_met_is_printed_once_with_the_levels_it_came_from() -> None:
    refusal = "HTTP 400: the request needs 13 KV blocks of 16 tokens but the cache has 4"
    run = BenchRun.planned(dataclasses.replace(PLAN, start_concurrency=4))
    for concurrency in (4, 2, 1):
        failed = LevelFigures(
            concurrency=concurrency,
            window_s=0.0,
            requests=20,
            succeeded=0,
            errors=20,
            error_samples=[refusal],
            success_rate=0.0,
            requests_per_s=0.0,
            output_tokens_per_s=0.0,
        )
        missed = breaches(PLAN.targets, PLAN.min_success_rate, failed)
        run.levels.append(msgspec.structs.replace(failed, breaches=missed))
        run.climb.record(concurrency, passed=False)
    console = Console(width=200, record=True)

    print_report(report_of(run), console)

    text = console.export_text()
    assert text.count(refusal) == 1
    assert f"error at concurrency 4, 2, 1: {refusal}" in text


def test_the_summary_says_where_the_numbers_came_from() -> None:
    summary = tuning_summary(report_of(run_against(ENGINE)), Path("/tmp/bench.json"))

    assert summary["source"] == "llmgw-cli bench"
    assert summary["capacity"] == 8
    assert summary["slo"] == ["ttft_p95 <= 300 ms"]
    assert summary["target"]["replica_id"] == "llama-2"
    assert summary["at_capacity"]["output_tokens_per_s"] == 133.0
    assert summary["peak"]["concurrency"] == 16
    assert summary["report_file"] == "/tmp/bench.json"
    assert len(msgspec.json.encode(summary)) < 4096


def test_the_recommendation_is_printed_as_it_is_applied() -> None:
    report = report_of(run_against(ENGINE))
    assert report.recommendation is not None
    exact = msgspec.structs.replace(report.recommendation, kv_ceiling=0.3125)
    console = Console(width=140, record=True)

    print_report(msgspec.structs.replace(report, recommendation=exact), console)

    assert "kv_ceiling 0.3125" in console.export_text()


def two_target_report() -> BenchReport:
    """The tour's bench: TTFT and TPOT both named, large figures in every column."""
    plan = dataclasses.replace(PLAN, targets=parse_targets(["ttft_p95=500ms", "tpot_p95=50ms"]))
    run = BenchRun.planned(plan)
    run.engine = Engine("http://127.0.0.7:8001", "llama", ignore_eos=True)
    for concurrency in (1, 2, 4, 8, 16):
        run.levels.append(measured(concurrency, 0.2271, 1588.8))
        run.climb.record(concurrency, passed=True)
    return report_of(run)


def rendered_lines(report: BenchReport, width: int, *, wide: bool = False) -> list[str]:
    console = Console(width=width, record=True, highlight=False)
    print_report(report, console, wide=wide)
    return console.export_text().splitlines()


def test_at_80_columns_the_levels_fit_whole_and_say_what_was_left_out() -> None:
    lines = rendered_lines(two_target_report(), 80)

    text = "\n".join(lines)
    table_lines = lines[lines.index(next(x for x in lines if "concurrency" in x)) :]
    assert all(len(line) <= 80 for line in table_lines)
    assert "…" not in text
    for header in ("concurrency", "SLO", "TTFT ms", "TPOT ms", "errors", "tok/s"):
        assert header in text
    assert "1588.8" in text
    assert "227/227" in text
    assert "(left out to fit: e2e ms p95/p99, req/s; --output wide shows them)" in text


def test_at_200_columns_or_wide_every_column_shows() -> None:
    for lines in (
        rendered_lines(two_target_report(), 200),
        rendered_lines(two_target_report(), 80, wide=True),
    ):
        text = "\n".join(lines)
        assert "left out" not in text
        assert "…" not in text
        for header in ("e2e ms", "req/s", "KV use", "waiting"):
            assert header in text


def test_at_80_columns_no_figure_is_cut_and_what_is_left_out_is_said() -> None:
    plan = dataclasses.replace(
        PLAN, targets=parse_targets(["ttft_p95=300ms", "tpot_p95=50ms", "e2e_p99=2s"])
    )
    slow = {1: (0.03, 1583.8), 2: (0.05, 10047.9), 4: (1.2, 10583.8)}
    console = Console(width=80, record=True, color_system=None)

    print_report(report_of(run_against(slow, plan)), console)

    text = console.export_text()
    assert "…" not in text
    assert "e+" not in text  # 1410 ms, not 1.41e+03
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    for figure in ("10047.9", "1583.8", "1410/1410", "30/30"):
        assert figure in text
    left_out = "(left out to fit: req/s, KV use p50/max, waiting p50/p95; --output wide shows"
    assert left_out in text


def test_a_capacity_of_one_is_one_concurrent_request() -> None:
    """One client is one request at a time: the verdict says so in the singular, whether
    the climb ended or was cut short after its first level."""
    finished = Console(width=140, record=True)
    cut_short = Console(width=140, record=True)

    print_report(report_of(run_against({1: (0.03, 30.0), 2: (0.5, 40.0)})), finished)
    print_report(report_of(run_against({1: (0.03, 30.0)}), failure="connection refused"), cut_short)

    assert "capacity: 1 concurrent request (to within 1)" in finished.export_text()
    assert "the SLO held up to 1 concurrent request\n" in cut_short.export_text()
