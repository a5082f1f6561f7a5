"""What an operator sees while a bench runs, on stderr (stdout is the report's alone).

Before the first request, the plan: the levels the climb may measure, what each level takes
and the most the whole bench may take. Then, on a terminal, a progress bar per level that
ends in the level's verdict, with which level of how many it is, the time elapsed and the
most still to come; elsewhere (a file, a pipe, a CI log), one line per level with the same,
flushed as it is printed, so the log follows the climb."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from cli.bench.load import ClosedLoop
from cli.bench.plan import BenchPlan
from cli.bench.runner import BenchRun
from cli.bench.slo import format_seconds
from cli.bench.stats import LevelFigures
from cli.render import counted, text

LEVELS_LISTED = 6
"""A climb of more doublings than this is shown by its first three and last two."""


def level_observer(console: Console, run: BenchRun) -> LevelProgress | LevelLines:
    """The ``Observer`` that suits where ``console`` writes. Use it as a context manager:
    entering prints the plan, so do it before the first request."""
    return LevelProgress(console, run) if console.is_terminal else LevelLines(console, run)


def plan_lines(run: BenchRun) -> list[str]:
    """The plan, as printed before the first request."""
    plan = run.plan
    climb_text = (
        f"bench plan: concurrency {_doublings(plan)}, doubling until a level breaks the SLO, "
        f"then bisecting to within {_precision(plan)}"
    )
    levels = run.climb.most_levels_left
    budget = plan.level_budget_s
    if budget is None:
        each = f"{format_span(plan.warmup_s)} warm-up + {plan.max_requests} measured requests"
        total = "no time estimate: a level takes as long as the engine needs to answer them"
    else:
        each = f"{format_span(plan.warmup_s)} warm-up + {format_span(plan.duration_s)} measure"
        total = (
            f"at most {format_span(levels * budget)}, plus the engine checks and each "
            "level's wait for its last answers"
        )
    return [climb_text, f"bench plan: at most {counted(levels, 'level')} of {each}: {total}"]


class Pace:
    """How far a bench is: which level of how many, the time elapsed, the most left.

    The time left counts each level still to come at its warm-up and measure window, or at
    the longest a level has taken so far when that is more: a level also waits for its last
    answers, which at high concurrency can take a while. An estimate, hence the "~"."""

    def __init__(self, run: BenchRun) -> None:
        self._run = run
        self._started = time.monotonic()
        self._level_started = self._started
        self._longest_level_s = 0.0

    def level_started(self) -> None:
        self._level_started = time.monotonic()

    def level_finished(self) -> None:
        self._longest_level_s = max(self._longest_level_s, time.monotonic() - self._level_started)

    def running(self) -> str:
        """While a level runs: it is the climb's next, not yet recorded."""
        done = len(self._run.levels)
        left = self._run.climb.most_levels_left
        head = f"level {done + 1} of at most {done + left}, {self._elapsed()} elapsed"
        per_level = self._per_level_s()
        if per_level is None:
            return f"{head}, at most {counted(left - 1, 'level')} more"
        this_one = max(0.0, per_level - (time.monotonic() - self._level_started))
        return f"{head}, at most ~{format_span(this_one + (left - 1) * per_level)} left"

    def finished(self) -> str:
        """Once a level is recorded."""
        done = len(self._run.levels)
        left = self._run.climb.most_levels_left
        if left == 0:
            return f"level {done} of {done}, {self._elapsed()} elapsed"
        head = f"level {done} of at most {done + left}, {self._elapsed()} elapsed"
        per_level = self._per_level_s()
        if per_level is None:
            return f"{head}, at most {counted(left, 'level')} more"
        return f"{head}, at most ~{format_span(left * per_level)} left"

    def _per_level_s(self) -> float | None:
        budget = self._run.plan.level_budget_s
        if budget is None:
            return self._longest_level_s or None
        return max(budget, self._longest_level_s)

    def _elapsed(self) -> str:
        return format_span(time.monotonic() - self._started)


class _PlanFirst:
    """What both observers share: the plan is printed on entering, before the first
    request, and the pace is kept level by level."""

    def __init__(self, console: Console, run: BenchRun) -> None:
        self._console = console
        self._run = run
        self._pace = Pace(run)

    def __enter__(self) -> Self:
        for line in plan_lines(self._run):
            self._print(line)
        self._begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._end()

    def _print(self, line: str) -> None:
        self._console.print(text(line), soft_wrap=True)

    def _begin(self) -> None:
        """After the plan, before the first level."""

    def _end(self) -> None:
        """After the last level, or when the bench stops early."""


class LevelProgress(_PlanFirst):
    """Progress bars, for a terminal."""

    def __init__(self, console: Console, run: BenchRun) -> None:
        super().__init__(console, run)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TextColumn("{task.fields[pace]}"),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._total = 0.0

    def _begin(self) -> None:
        self._progress.start()

    def _end(self) -> None:
        self._progress.stop()

    def level_started(self, load: ClosedLoop) -> None:
        self._pace.level_started()
        total = load.max_requests if load.max_requests is not None else load.duration_s
        self._total = float(total)
        self._task = self._progress.add_task(
            _description(load), total=total, counts="", pace=self._pace.running(), completed=0
        )

    def level_progress(self, load: ClosedLoop) -> None:
        if self._task is None:
            return
        done = load.measured if load.max_requests is not None else load.window_elapsed_s
        self._progress.update(
            self._task,
            description=_description(load),
            completed=done,
            counts=f"{len(load.outcomes)} done, {len(load.errors)} errors",
            pace=self._pace.running(),
        )

    def level_finished(self, figures: LevelFigures) -> None:
        self._pace.level_finished()
        if self._task is None:
            return
        self._progress.update(
            self._task,
            description=_verdict(figures),
            completed=self._total,
            counts=_figures(figures),
            pace=self._pace.finished(),
        )
        self._task = None


class LevelLines(_PlanFirst):
    """The plan, then one line per finished level, for whatever is not a terminal. Rich
    shows nothing of a progress bar there until it stops, which is when the bench ends."""

    def level_started(self, load: ClosedLoop) -> None:
        self._pace.level_started()

    def level_progress(self, load: ClosedLoop) -> None:
        pass

    def level_finished(self, figures: LevelFigures) -> None:
        self._pace.level_finished()
        self._print(f"{self._pace.finished()}: {_verdict(figures)}  {_figures(figures)}")

    def _print(self, line: str) -> None:
        super()._print(line)
        self._console.file.flush()

    def _end(self) -> None:
        self._console.file.flush()


def format_span(seconds: float) -> str:
    """A stretch of time as an operator reads it: 0.6s, 35s, 8m10s, 1h05m."""
    if seconds < 10:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _doublings(plan: BenchPlan) -> str:
    levels = [plan.start_concurrency]
    while levels[-1] < plan.max_concurrency:
        levels.append(min(levels[-1] * 2, plan.max_concurrency))
    if len(levels) > LEVELS_LISTED:
        return ", ".join(map(str, levels[:3])) + ", ... " + ", ".join(map(str, levels[-2:]))
    return ", ".join(map(str, levels))


def _precision(plan: BenchPlan) -> str:
    if plan.precision == 0:
        return "one"
    return f"{plan.precision * 100:g}% (never closer than one)"


def _description(load: ClosedLoop) -> str:
    return f"concurrency {load.concurrency:>4}: {load.phase.value}"


def _verdict(figures: LevelFigures) -> str:
    verdict = "met the SLO" if figures.slo_met else "broke the SLO: " + "; ".join(figures.breaches)
    return f"concurrency {figures.concurrency:>4}: {verdict}"


def _figures(figures: LevelFigures) -> str:
    ttft = "-" if figures.ttft_s is None else format_seconds(figures.ttft_s.p95)
    return (
        f"{figures.output_tokens_per_s:.1f} tok/s, TTFT p95 {ttft}, "
        f"{figures.errors}/{figures.requests} errors"
    )
