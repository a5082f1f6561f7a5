"""What an operator sees while a bench runs, on stderr: on a terminal, a progress bar per
level that ends in the level's verdict; elsewhere (a file, a pipe, a CI log), one line per
level with that verdict, flushed as it is printed, so the log follows the climb."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from cli.bench.load import ClosedLoop
from cli.bench.slo import format_seconds
from cli.bench.stats import LevelFigures


def level_observer(console: Console) -> LevelProgress | LevelLines:
    """The ``Observer`` that suits where ``console`` writes. Use it as a context manager."""
    return LevelProgress(console) if console.is_terminal else LevelLines(console)


class LevelProgress:
    """Progress bars, for a terminal."""

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
        self._progress.update(
            self._task,
            description=_verdict(figures),
            completed=self._total,
            counts=_figures(figures),
        )
        self._task = None


class LevelLines:
    """One line per finished level, for whatever is not a terminal. Rich shows nothing of
    a progress bar there until it stops, which is when the bench ends."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._console.file.flush()

    def level_started(self, load: ClosedLoop) -> None:
        pass

    def level_progress(self, load: ClosedLoop) -> None:
        pass

    def level_finished(self, figures: LevelFigures) -> None:
        self._console.print(
            f"{_verdict(figures)}  {_figures(figures)}", markup=False, soft_wrap=True
        )
        self._console.file.flush()


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
