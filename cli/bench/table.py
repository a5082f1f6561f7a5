"""The report for people: one row per level, then the verdict and the recommendation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from cli.bench.report import FAILED, INTERRUPTED, BenchReport
from cli.bench.stats import LevelFigures, Percentiles
from cli.render import lays_out_whole, text


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[LevelFigures], str]
    latency: str | None = None
    """The latency this column shows: never left out when the SLO names it."""
    cache: bool = False
    drop: int = 0
    """0: always shown; 1, 2, ...: left out in this order (1 first) when the console is too
    narrow for every column, before any value would be cut."""


COLUMNS = (
    _Column("SLO", lambda lv: "met" if lv.slo_met else "broken"),
    _Column("req/s", lambda lv: f"{lv.requests_per_s:.2f}", drop=3),
    _Column("out\ntok/s", lambda lv: f"{lv.output_tokens_per_s:.1f}"),
    _Column("TTFT ms\np50/p95", lambda lv: _milliseconds(lv.ttft_s, 50, 95)),
    _Column(
        "TPOT ms\np50/p95", lambda lv: _milliseconds(lv.tpot_s, 50, 95), latency="tpot", drop=2
    ),
    _Column("e2e ms\np95/p99", lambda lv: _milliseconds(lv.e2e_s, 95, 99), latency="e2e", drop=1),
    _Column("errors", lambda lv: f"{lv.errors}/{lv.requests}"),
    _Column("waiting\np50/p95", lambda lv: _pair(lv.waiting, _count, "p50", "p95"), drop=5),
    _Column("KV use\np50/max", lambda lv: _pair(lv.kv_cache_usage, _percent, "p50", "max"), drop=4),
    _Column(
        "cache\nhits",
        lambda lv: "-" if lv.prefix_cache_hit_rate is None else f"{lv.prefix_cache_hit_rate:.0%}",
        cache=True,
        drop=1,
    ),
)


def print_report(report: BenchReport, console: Console, *, wide: bool = False) -> None:
    """The levels as a table that fits ``console``: columns go in their stated order when
    it is too narrow (never concurrency, SLO, TTFT, errors or a latency the SLO names) and
    a line says which; ``wide`` shows every column, however wide the table gets."""
    wide = wide or lays_out_whole(console)
    shown = [column for column in COLUMNS if not column.cache or report.workload.shared_prefix]
    named = {target.latency for target in report.slo.targets}
    droppable = sorted(
        (c for c in shown if c.drop and (c.latency is None or c.latency not in named)),
        key=lambda c: c.drop,
    )
    table = _table(report, shown)
    left_out: list[_Column] = []
    for column in [] if wide else droppable:
        if _natural_width(table, console) <= console.width:
            break
        shown.remove(column)
        left_out.append(column)
        table = _table(report, shown)
    # Wide, or nothing left to leave out: a table wider than the console, never a value cut
    # short.
    width = console.width
    console.width = max(width, _natural_width(table, console))
    try:
        console.print(table)
    finally:
        console.width = width
    if left_out:
        headers = ", ".join(column.header.replace("\n", " ") for column in left_out)
        console.print(text(f"(left out to fit: {headers}; --output wide shows them)"))
    for line in _verdict(report):
        console.print(text(line))


def _table(report: BenchReport, columns: list[_Column]) -> Table:
    table = Table(
        title=text(_title(report)),
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


def _natural_width(table: Table, console: Console) -> int:
    """The width ``table`` takes with every value whole (its title wraps, so not counted)."""
    title, table.title = table.title, None
    try:
        return Measurement.get(console, console.options.update_width(10_000), table).maximum
    finally:
        table.title = title


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


def _concurrent(requests: int) -> str:
    return f"{requests} concurrent request{'' if requests == 1 else 's'}"


def _verdict(report: BenchReport) -> list[str]:
    lines = []
    stopped_early = report.stop_reason in (FAILED, INTERRUPTED)
    if stopped_early:
        if report.capacity:
            lines.append(
                f"capacity: unknown, the bench stopped early; the SLO held up to "
                f"{_concurrent(report.capacity)}"
            )
    elif report.capacity_is_lower_bound:
        lines.append(f"capacity: at least {_concurrent(report.capacity)}")
    elif report.capacity:
        lines.append(f"capacity: {_concurrent(report.capacity)} (to within {report.resolution})")
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
    # One line per message, however many levels it came from: an engine that refuses every
    # request says so once, not once a level.
    levels_by_error: dict[str, list[str]] = {}
    for level in report.levels:
        for sample in level.error_samples:
            levels_by_error.setdefault(sample, []).append(str(level.concurrency))
    for sample, concurrencies in levels_by_error.items():
        lines.append(f"error at concurrency {', '.join(concurrencies)}: {sample}")
    return lines
