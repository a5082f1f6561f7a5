"""Running a planned bench: the climb, the report files and table, and ``--apply``."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from cli.bench.climb import StopReason
from cli.bench.errors import BenchError
from cli.bench.files import CHART_FILE, REPORT_FILE
from cli.bench.plan import BenchPlan
from cli.bench.progress import level_observer
from cli.bench.report import (
    INTERRUPTED,
    AppliedView,
    BenchReport,
    TargetView,
    build_report,
    tuning_summary,
    write_json,
)
from cli.bench.runner import BenchRun, run_bench
from cli.bench.table import print_report
from cli.bench.target import Api, Target, left_service
from cli.client import AdminClient, ClientError
from cli.config import ConnectionSettings
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    make_console,
    print_error,
    print_json,
    text,
    warn,
)
from cli.tuning import tune

NO_CHART = (
    "no chart: matplotlib is not installed; `pip install 'llmgw[bench]'` adds it to draw "
    f"{CHART_FILE} next time"
)


def run_and_report(
    plan: BenchPlan,
    target: Target,
    model: str | None,
    api: Api,
    report_dir: Path | None,
    output: Literal["table", "wide", "json"],
    settings: ConnectionSettings | None,
    apply: bool,
    apply_to: Literal["model", "replica"],
) -> int:
    """Run the climb, write and print the report (whenever a level ran), apply the
    recommendation when ``apply`` is given (through the admin API of ``settings``); the
    exit code."""
    run = BenchRun.planned(plan)
    console = make_console(stderr=True)
    started_at = datetime.now(UTC)
    failure: str | None = None
    try:
        with level_observer(console, run) as progress:
            asyncio.run(_stopped_by_sigterm(run_bench(run, target.root_url, model, api, progress)))
    except BenchError as exc:
        failure = _with_replica_phase(str(exc), target, settings)
    except (KeyboardInterrupt, _Terminated):
        failure = INTERRUPTED
    view = TargetView(
        url=target.root_url,
        model=model or target.model,
        replica_id=target.replica_id,
        revision=target.revision,
        api=api,
    )
    report = build_report(
        run, view, started_at=started_at, finished_at=datetime.now(UTC), failure=failure
    )
    directory = report_dir or _default_report_dir(target, report)
    code, problem = EXIT_OK, None
    if failure is not None:
        code, problem = EXIT_FAILED, failure if failure != INTERRUPTED else "interrupted"
    elif report.stop_reason == StopReason.FIRST_LEVEL_BROKEN:
        code, problem = EXIT_FAILED, report.stop_detail
    elif apply and settings is not None:
        report, problem = _apply(report, target, settings, apply_to, directory / REPORT_FILE)
        code = EXIT_OK if problem is None else EXIT_FAILED
    if report.levels:
        _write_files(report, directory, console)
        if output == "json":
            print_json((directory / REPORT_FILE).read_bytes())
        else:
            print_report(report, make_console(), wide=output == "wide")
    if problem is not None:
        print_error("bench", problem)
    return code


class _Terminated(Exception):
    pass


def _with_replica_phase(failure: str, target: Target, settings: ConnectionSettings | None) -> str:
    """``failure``, and, when the replica benched has left service meanwhile, that it has:
    its engine is unreachable because llmgw stopped it. The failure alone when the admin
    API cannot say (it is what ended the run either way)."""
    if target.replica_id is None or settings is None:
        return failure
    try:
        with AdminClient(settings) as client:
            reason = left_service(client, target.replica_id)
    except ClientError:
        return failure
    return failure if reason is None else f"{failure}; {reason}"


async def _stopped_by_sigterm(bench: Coroutine[Any, Any, None]) -> None:
    """Runs ``bench``; SIGTERM (``timeout``, ``kill``, a CI job's end) stops it as Ctrl-C
    does, so the levels that ran are still reported."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        await bench
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _apply(
    report: BenchReport,
    target: Target,
    settings: ConnectionSettings,
    apply_to: Literal["model", "replica"],
    report_file: Path,
) -> tuple[BenchReport, str | None]:
    """The report with what was applied, or the reason nothing was."""
    recommendation = report.recommendation
    model = target.model or report.target.model
    if recommendation is None or model is None:
        return report, f"--apply: nothing to apply: {report.recommendation_note}"
    replica_id = target.replica_id if apply_to == "replica" else None
    try:
        with AdminClient(settings) as client:
            result = tune(
                client,
                model,
                weight=recommendation.weight,
                target_waiting=recommendation.target_waiting,
                kv_ceiling=recommendation.kv_ceiling,
                replica_id=replica_id,
                summary=tuning_summary(report, report_file.resolve()),
                revision=target.revision,
            )
    except ClientError as exc:
        return report, f"--apply: {exc}"
    subject = f"replica {replica_id}" if replica_id else f"model {model}"
    warn(
        f"applied to {subject}: weight {result.routing.weight:g}, target_waiting "
        f"{result.routing.target_waiting}, kv_ceiling {result.routing.kv_ceiling:g}"
        + ("" if result.changed else " (already in force: nothing recorded)")
    )
    applied = AppliedView(model=model, replica_id=replica_id, changed=result.changed)
    return report.with_applied(applied), None


def _write_files(report: BenchReport, directory: Path, console: Console) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(report, directory / REPORT_FILE)
    try:
        # matplotlib takes a while to load; a run that drew nothing does not pay for it.
        from cli.bench.chart import write_chart
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != "matplotlib":
            raise
        # One line, however narrow the terminal; its brackets are not markup.
        console.print(text(f"report: {directory / REPORT_FILE}; {NO_CHART}"), soft_wrap=True)
        return
    write_chart(report, directory / CHART_FILE)
    console.print(
        text(f"report: {directory / REPORT_FILE}, chart: {directory / CHART_FILE}"),
        soft_wrap=True,
    )


def _default_report_dir(target: Target, report: BenchReport) -> Path:
    name = target.replica_id or report.target.model or "engine"
    stamp = report.started_at.strftime("%Y%m%dT%H%M%SZ")
    return reports_home() / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}-{stamp}"


def reports_home() -> Path:
    """Where reports go unless ``--report-dir`` says: the XDG state directory, which holds
    what a tool keeps between runs that is not worth backing up, never the working
    directory. A relative ``$XDG_STATE_HOME`` is ignored, as the XDG spec asks."""
    state_home = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state_home) if os.path.isabs(state_home) else Path.home() / ".local" / "state"
    return base / "llmgw" / "bench"
