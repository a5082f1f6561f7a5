"""What a bench found, whole or partial: one ``BenchReport``, printed as a table, written
as JSON, drawn by ``chart``, and condensed into the summary ``--apply`` records."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from cli.bench.climb import StopReason
from cli.bench.recommend import (
    NoRecommendation,
    Recommendation,
    lower_bound_note,
    recommend,
)
from cli.bench.runner import BenchRun
from cli.bench.slo import SloTarget
from cli.bench.stats import LevelFigures, Percentiles
from cli.render import counted

REPORT_VERSION = 1
FAILED = "failed"
INTERRUPTED = "interrupted"


class TargetView(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    model: str | None
    replica_id: str | None = None
    revision: int | None = None
    """The model's revision the replica runs (a replica only)."""
    api: str
    ignore_eos: bool | None = None


class WorkloadView(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int
    output_tokens: int
    shared_prefix: bool
    warmup_s: float
    duration_s: float
    max_requests: int | None
    sample_interval_s: float
    prefix_cache_reset: str | None
    """The route that reset the engine's prefix cache before each level, if any did."""


class SloView(msgspec.Struct, frozen=True, kw_only=True):
    targets: list[SloTarget]
    min_success_rate: float


class PeakView(msgspec.Struct, frozen=True, kw_only=True):
    concurrency: int
    output_tokens_per_s: float
    requests_per_s: float
    slo_met: bool


class AppliedView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    replica_id: str | None
    changed: bool


class BenchReport(msgspec.Struct, frozen=True, kw_only=True):
    version: int = REPORT_VERSION
    started_at: datetime
    finished_at: datetime
    target: TargetView
    workload: WorkloadView
    slo: SloView
    levels: list[LevelFigures]
    """In the order they were measured."""
    capacity: int
    """The highest concurrency that met the SLO; 0 when none did."""
    capacity_is_lower_bound: bool
    """The highest concurrency allowed still met it: the engine can take more, and no
    recommendation is made from a level that was not its limit."""
    resolution: int
    """How far apart the last passing and first failing levels were when the climb ended."""
    peak: PeakView | None
    stop_reason: str
    stop_detail: str
    recommendation: Recommendation | None
    recommendation_note: str | None = None
    notes: list[str] = []
    applied: AppliedView | None = None

    @property
    def complete(self) -> bool:
        return self.stop_reason in (StopReason.SLO_BROKEN, StopReason.CEILING)

    def with_applied(self, applied: AppliedView) -> BenchReport:
        return msgspec.structs.replace(self, applied=applied)

    def level(self, concurrency: int) -> LevelFigures | None:
        return next((lv for lv in reversed(self.levels) if lv.concurrency == concurrency), None)


def build_report(
    run: BenchRun,
    target: TargetView,
    *,
    started_at: datetime,
    finished_at: datetime,
    failure: str | None = None,
) -> BenchReport:
    """``failure``: why the bench ended before the climb did (``INTERRUPTED`` or a message)."""
    plan = run.plan
    climb = run.climb
    engine = run.engine
    if engine is not None:
        target = msgspec.structs.replace(target, model=engine.model, ignore_eos=engine.ignore_eos)
    capacity_level = next(
        (lv for lv in reversed(run.levels) if lv.concurrency == climb.capacity and lv.slo_met),
        None,
    )
    recommendation: Recommendation | None = None
    note: str | None = None
    if failure is None and climb.stop_reason is StopReason.CEILING:
        note = lower_bound_note(plan.max_concurrency)
    else:
        recommendation, note = _recommendation(capacity_level, run.levels, failure)
    stop_reason, stop_detail = _stop(run, failure)
    return BenchReport(
        started_at=started_at,
        finished_at=finished_at,
        target=target,
        workload=WorkloadView(
            input_tokens=plan.input_tokens,
            output_tokens=plan.output_tokens,
            shared_prefix=plan.shared_prefix,
            warmup_s=plan.warmup_s,
            duration_s=plan.duration_s,
            max_requests=plan.max_requests,
            sample_interval_s=plan.sample_interval_s,
            prefix_cache_reset=run.cache_reset,
        ),
        slo=SloView(targets=list(plan.targets), min_success_rate=plan.min_success_rate),
        levels=list(run.levels),
        capacity=climb.capacity,
        capacity_is_lower_bound=climb.stop_reason is StopReason.CEILING,
        resolution=climb.resolution,
        peak=_peak(run.levels),
        stop_reason=stop_reason,
        stop_detail=stop_detail,
        recommendation=recommendation,
        recommendation_note=note,
        notes=list(run.notes),
    )


def _recommendation(
    capacity_level: LevelFigures | None, levels: Sequence[LevelFigures], failure: str | None
) -> tuple[Recommendation | None, str | None]:
    if failure is not None:
        return None, "the bench did not finish, so its capacity is not known"
    if capacity_level is None:
        return None, "no level met the SLO"
    try:
        return recommend(capacity_level, [lv for lv in levels if lv.slo_met]), None
    except NoRecommendation as exc:
        return None, str(exc)


def _stop(run: BenchRun, failure: str | None) -> tuple[str, str]:
    climb = run.climb
    if failure == INTERRUPTED:
        return INTERRUPTED, f"interrupted after {counted(len(run.levels), 'level')}"
    if failure is not None:
        return FAILED, failure
    reason = climb.stop_reason
    failing = _last_at(run.levels, climb.failing)
    if reason is StopReason.FIRST_LEVEL_BROKEN:
        why = "; ".join(failing.breaches) if failing else ""
        return reason, f"even concurrency {climb.failing} broke the SLO: {why}"
    if reason is StopReason.SLO_BROKEN:
        why = "; ".join(failing.breaches) if failing else ""
        return reason, (
            f"concurrency {climb.failing} broke the SLO ({why}); {climb.capacity} met it"
        )
    return StopReason.CEILING, (
        f"concurrency {climb.capacity} (--max-concurrency) still met the SLO: the capacity is "
        "at least that"
    )


def _last_at(levels: Sequence[LevelFigures], concurrency: int | None) -> LevelFigures | None:
    return next((lv for lv in reversed(levels) if lv.concurrency == concurrency), None)


def _peak(levels: Sequence[LevelFigures]) -> PeakView | None:
    if not levels:
        return None
    best = max(levels, key=lambda lv: lv.output_tokens_per_s)
    return PeakView(
        concurrency=best.concurrency,
        output_tokens_per_s=best.output_tokens_per_s,
        requests_per_s=best.requests_per_s,
        slo_met=best.slo_met,
    )


def write_json(report: BenchReport, path: Path) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")


def tuning_summary(report: BenchReport, report_file: Path | None = None) -> dict[str, Any]:
    """What ``--apply`` records with the settings, so the log says where they came from."""
    at_capacity = report.level(report.capacity)
    summary: dict[str, Any] = {
        "source": "llmgw-cli bench",
        "measured_at": report.finished_at.isoformat(),
        "target": msgspec.to_builtins(report.target),
        "workload": {
            "input_tokens": report.workload.input_tokens,
            "output_tokens": report.workload.output_tokens,
            "shared_prefix": report.workload.shared_prefix,
        },
        "slo": [target.describe() for target in report.slo.targets],
        "min_success_rate": report.slo.min_success_rate,
        "capacity": report.capacity,
        "capacity_is_lower_bound": report.capacity_is_lower_bound,
        "stop_reason": report.stop_reason,
        "stop_detail": report.stop_detail,
        "levels": len(report.levels),
    }
    if at_capacity is not None:
        summary["at_capacity"] = _condensed(at_capacity)
    if report.peak is not None:
        summary["peak"] = msgspec.to_builtins(report.peak)
    if report_file is not None:
        summary["report_file"] = str(report_file)
    return summary


def _condensed(level: LevelFigures) -> dict[str, Any]:
    def p95(figures: Percentiles | None) -> float | None:
        return None if figures is None else round(figures.p95, 6)

    return {
        "requests_per_s": round(level.requests_per_s, 3),
        "output_tokens_per_s": round(level.output_tokens_per_s, 1),
        "ttft_p95_s": p95(level.ttft_s),
        "tpot_p95_s": p95(level.tpot_s),
        "e2e_p95_s": p95(level.e2e_s),
        "waiting_p95": p95(level.waiting),
        "kv_cache_usage_max": None if level.kv_cache_usage is None else level.kv_cache_usage.max,
        "success_rate": level.success_rate,
    }
