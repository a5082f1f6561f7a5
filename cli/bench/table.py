"""The report for people: one row per level, then the verdict and the recommendation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from cli.bench.report import FAILED, INTERRUPTED, BenchReport
from cli.bench.stats import LevelFigures, Percentiles

FULL_WIDTH = 110
"""Narrower consoles get only the latencies the SLO names (TTFT always) and cache hits
only for a shared-prefix run; if that is still too wide, columns are left out in their
``drop`` order (and the report file keeps every figure). No figure is ever cut short."""


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[LevelFigures], str]
    latency: str | None = None
    cache: bool = False
    drop: int = 0
    """Left out to fit a narrow terminal: 1 first, then 2, ...; 0 never."""


COLUMNS = (
    _Column("SLO", lambda lv: "met" if lv.slo_met else "broken"),
    _Column("req/s", lambda lv: f"{lv.requests_per_s:.2f}", drop=4),
    _Column("out\ntok/s", lambda lv: f"{lv.output_tokens_per_s:.1f}"),
    _Column("TTFT ms\np50/p95", lambda lv: _milliseconds(lv.ttft_s, 50, 95)),
    _Column("TPOT ms\np50/p95", lambda lv: _milliseconds(lv.tpot_s, 50, 95), latency="tpot"),
    _Column("e2e ms\np95/p99", lambda lv: _milliseconds(lv.e2e_s, 95, 99), latency="e2e"),
    _Column("errors", lambda lv: f"{lv.errors}/{lv.requests}"),
    _Column("waiting\np50/p95", lambda lv: _pair(lv.waiting, _count, "p50", "p95"), drop=2),
    _Column("KV use\np50/max", lambda lv: _pair(lv.kv_cache_usage, _percent, "p50", "max"), drop=1),
    _Column(
        "cache\nhits",
        lambda lv: "-" if lv.prefix_cache_hit_rate is None else f"{lv.prefix_cache_hit_rate:.0%}",
        cache=True,
        drop=3,
    ),
)


def print_report(report: BenchReport, console: Console) -> None:
    columns = _columns(report, wide=console.width >= FULL_WIDTH)
    table = _table(report, columns)
    left_out: list[_Column] = []
    for column in sorted((c for c in columns if c.drop), key=lambda c: c.drop):
        if _natural_width(console, table) <= console.width:
            break
        columns.remove(column)
        left_out.append(column)
        table = _table(report, columns)
    console.print(table)
    if left_out:
        names = ", ".join(" ".join(column.header.split()) for column in left_out)
        console.print(Text(f"(left out to fit: {names}; bench.json has them)"))
    for line in _verdict(report):
        console.print(Text(line))


def _natural_width(console: Console, table: Table) -> int:
    """How wide ``table`` is with no cell cut (rich measures within the console's width)."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def _table(report: BenchReport, columns: list[_Column]) -> Table:
    table = Table(
        title=_title(report),
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        expand=False,
    )
    table.add_column("concurrency", justify="right", no_wrap=True)
    for column in columns:
        table.add_column(
            column.header, justify="left" if column.header == "SLO" else "right", no_wrap=True
        )
    for level in sorted(report.levels, key=lambda lv: lv.concurrency):
        table.add_row(
            _concurrency(level, report),
            *(column.cell(level) for column in columns),
            style=_style(level, report),
        )
    return table


def _columns(report: BenchReport, *, wide: bool) -> list[_Column]:
    if wide:
        return list(COLUMNS)
    named = {target.latency for target in report.slo.targets}
    return [
        column
        for column in COLUMNS
        if (column.latency is None or column.latency in named)
        and (not column.cache or report.workload.shared_prefix)
    ]


def _title(report: BenchReport) -> str:
    target = report.target
    name = f"replica {target.replica_id}" if target.replica_id else target.url
    slo = ", ".join(t.describe() for t in report.slo.targets)
    workload = report.workload
    prompts = "shared prefix" if workload.shared_prefix else "unique prompts"
    return (
        f"bench of {name} ({target.model}): {slo}, success >= {report.slo.min_success_rate:.1%}; "
        f"{workload.input_tokens} in / {workload.output_tokens} out tokens, {prompts}"
    )


def _concurrency(level: LevelFigures, report: BenchReport) -> str:
    marks = []
    if report.complete and level.concurrency == report.capacity:
        marks.append("cap")
    if report.peak is not None and level.concurrency == report.peak.concurrency:
        marks.append("peak")
    return " ".join([*marks, str(level.concurrency)])


def _style(level: LevelFigures, report: BenchReport) -> str:
    if report.complete and level.concurrency == report.capacity:
        return "bold green"
    return "" if level.slo_met else "red"


def _milliseconds(figures: Percentiles | None, low: int, high: int) -> str:
    if figures is None:
        return "-"
    return f"{_ms(figures.at(low) * 1000)}/{_ms(figures.at(high) * 1000)}"


def _ms(value: float) -> str:
    """Three significant figures, and whole milliseconds from 100 up: never ``1.11e+03``."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _pair(figures: Percentiles | None, form: Callable[[float], str], low: str, high: str) -> str:
    if figures is None:
        return "-"
    return f"{form(getattr(figures, low))}/{form(getattr(figures, high))}"


def _count(value: float) -> str:
    return f"{value:.0f}"


def _percent(value: float) -> str:
    return f"{value:.0%}" if value >= 0.1 or value == 0 else f"{value:.1%}"


def _verdict(report: BenchReport) -> list[str]:
    lines = []
    stopped_early = report.stop_reason in (FAILED, INTERRUPTED)
    if stopped_early:
        if report.capacity:
            lines.append(
                f"capacity: unknown, the bench stopped early; the SLO held up to "
                f"{report.capacity} concurrent requests"
            )
    elif report.capacity_is_lower_bound:
        lines.append(f"capacity: at least {report.capacity} concurrent requests")
    elif report.capacity:
        lines.append(
            f"capacity: {report.capacity} concurrent requests (to within {report.resolution})"
        )
    at_capacity = report.level(report.capacity)
    if at_capacity is not None and at_capacity.slo_met and not stopped_early:
        lines.append(
            f"  at capacity: {at_capacity.output_tokens_per_s:.1f} output tokens/s, "
            f"{at_capacity.requests_per_s:.2f} requests/s"
        )
    peak = report.peak
    if peak is not None:
        verdict = "met" if peak.slo_met else "broke"
        lines.append(
            f"peak throughput: {peak.output_tokens_per_s:.1f} output tokens/s at concurrency "
            f"{peak.concurrency}, which {verdict} the SLO"
        )
    lines.append(f"stopped: {report.stop_detail}")
    recommendation = report.recommendation
    if recommendation is not None:
        lines.append(
            f"recommended: weight {recommendation.weight:g}, target_waiting "
            f"{recommendation.target_waiting}, kv_ceiling {recommendation.kv_ceiling:g}"
        )
    elif report.recommendation_note:
        lines.append(f"no recommendation: {report.recommendation_note}")
    lines.extend(f"note: {note}" for note in report.notes)
    for level in report.levels:
        for sample in level.error_samples:
            lines.append(f"error at concurrency {level.concurrency}: {sample}")
    return lines
