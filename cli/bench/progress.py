"""A progress bar per level on stderr, and a line with the level's verdict when it ends."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from cli.bench.load import ClosedLoop
from cli.bench.slo import format_seconds
from cli.bench.stats import LevelFigures


class LevelProgress:
    """The ``Observer`` of a bench run. Use it as a context manager."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._total = 0.0

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def level_started(self, load: ClosedLoop) -> None:
        total = load.max_requests if load.max_requests is not None else load.duration_s
        self._total = float(total)
        self._task = self._progress.add_task(
            _description(load), total=total, counts="", completed=0
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
        )

    def level_finished(self, figures: LevelFigures) -> None:
        if self._task is None:
            return
        verdict = (
            "met the SLO" if figures.slo_met else "broke the SLO: " + "; ".join(figures.breaches)
        )
        ttft = "-" if figures.ttft_s is None else format_seconds(figures.ttft_s.p95)
        self._progress.update(
            self._task,
            description=f"concurrency {figures.concurrency:>4}: {verdict}",
            completed=self._total,
            counts=(
                f"{figures.output_tokens_per_s:.1f} tok/s, TTFT p95 {ttft}, "
                f"{figures.errors}/{figures.requests} errors"
            ),
        )
        self._task = None


def _description(load: ClosedLoop) -> str:
    return f"concurrency {load.concurrency:>4}: {load.phase.value}"
