"""The chart an operator puts in a ticket: latency percentiles and throughput against
concurrency, with the SLO, the capacity and the peak marked.

Drawn on matplotlib's Agg canvas (no display, no pyplot state), imported by this module
only, so that the rest of the command line does not pay for loading it.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from cli.bench.report import BenchReport
from cli.bench.stats import LevelFigures, Percentiles

COLORS = {"ttft": "tab:blue", "tpot": "tab:orange", "e2e": "tab:purple"}
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end to end"}
STYLES = {50: ":", 95: "-", 99: "--"}


def write_chart(report: BenchReport, path: Path) -> None:
    levels = _one_per_concurrency(report.levels)
    concurrency = [level.concurrency for level in levels]
    figure = Figure(figsize=(10, 8))
    FigureCanvasAgg(figure)
    latency_axes, throughput_axes = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    for latency in ("ttft", "tpot", "e2e"):
        for percentile, style in STYLES.items():
            points = [
                (level.concurrency, figures.at(percentile) * 1000)
                for level in levels
                if (figures := _latency(level, latency)) is not None
            ]
            if points:
                latency_axes.plot(
                    *zip(*points, strict=True),
                    style,
                    marker="o",
                    markersize=3,
                    color=COLORS[latency],
                    label=f"{LABELS[latency]} p{percentile}",
                )
    for target in report.slo.targets:
        latency_axes.axhline(
            target.limit_s * 1000,
            color=COLORS[target.latency],
            linewidth=2,
            alpha=0.5,
            label=f"SLO {target.describe()}",
        )
    latency_axes.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    latency_axes.yaxis.set_major_formatter(plain)
    latency_axes.yaxis.set_minor_formatter(plain)
    latency_axes.tick_params(axis="y", which="minor", labelsize="x-small")
    latency_axes.set_ylabel("latency (ms, log scale)")
    latency_axes.legend(fontsize="x-small", ncol=3, loc="best")
    latency_axes.grid(True, which="both", alpha=0.3)

    throughput_axes.plot(
        concurrency, [level.output_tokens_per_s for level in levels], "-o", color="tab:green"
    )
    throughput_axes.set_ylabel("output tokens/s", color="tab:green")
    requests_axes = throughput_axes.twinx()
    requests_axes.plot(
        concurrency, [level.requests_per_s for level in levels], ":s", color="tab:gray"
    )
    requests_axes.set_ylabel("requests/s", color="tab:gray")
    # The twin axes are drawn over the first ones; lift the tokens line and its markers.
    throughput_axes.set_zorder(requests_axes.get_zorder() + 1)
    throughput_axes.patch.set_visible(False)
    throughput_axes.grid(True, alpha=0.3)
    for level in levels:
        if not level.slo_met:
            throughput_axes.plot(level.concurrency, level.output_tokens_per_s, "x", color="red")

    broken = [level.concurrency for level in levels if not level.slo_met]
    if broken:
        for axes in (latency_axes, throughput_axes):
            axes.axvspan(min(broken), max(concurrency) * 1.1, color="red", alpha=0.06)
    if report.complete and report.capacity > 0:
        for axes in (latency_axes, throughput_axes):
            axes.axvline(report.capacity, color="green", linestyle="--", alpha=0.7)
        throughput_axes.annotate(
            f"capacity {report.capacity}",
            (report.capacity, 0),
            xycoords=("data", "axes fraction"),
            xytext=(4, 4),
            textcoords="offset points",
            color="green",
        )
    if report.peak is not None:
        throughput_axes.plot(
            report.peak.concurrency,
            report.peak.output_tokens_per_s,
            "*",
            markersize=14,
            color="gold",
            markeredgecolor="black",
        )
        throughput_axes.annotate(
            f"peak {report.peak.output_tokens_per_s:.0f} tok/s",
            (report.peak.concurrency, report.peak.output_tokens_per_s),
            xytext=(6, -12),
            textcoords="offset points",
        )
    throughput_axes.set_xscale("log", base=2)
    throughput_axes.set_xticks(concurrency, [str(c) for c in concurrency])
    throughput_axes.xaxis.set_minor_locator(NullLocator())
    throughput_axes.set_xlabel("concurrent requests (red: SLO broken)")
    name = report.target.replica_id or report.target.url
    figure.suptitle(f"bench of {name} ({report.target.model}): {report.stop_detail}", wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _one_per_concurrency(levels: list[LevelFigures]) -> list[LevelFigures]:
    latest = {level.concurrency: level for level in levels}
    return [latest[c] for c in sorted(latest)]


def _latency(level: LevelFigures, latency: str) -> Percentiles | None:
    return {"ttft": level.ttft_s, "tpot": level.tpot_s, "e2e": level.e2e_s}[latency]
