"""Which concurrency to measure next: a geometric climb, then a bisection.

A pure state machine; the runner measures the level it names and records the verdict::

    climb = Climb(start=1, ceiling=1024)
    while (level := climb.next_level) is not None:
        climb.record(level, passed=measure(level))
    climb.capacity, climb.stop_reason

The climb doubles the level (1, 2, 4, ...) until one breaks the SLO or the ceiling is
reached. It then bisects between the highest level that passed and the lowest that broke
until they are ``resolution`` apart: one level, or ``precision`` of the passing level when
that is more (measuring 412 rather than 410 costs a level and says nothing new). A first
level that breaks is bisected towards zero, which counts as passing; when even
concurrency 1 breaks, the capacity is zero.

``most_levels_left`` bounds how many levels are still to come, whatever the verdicts, so a
bench can say beforehand how long it may take and, as it goes, how long it still may.
"""

from __future__ import annotations

import math
from enum import StrEnum


class StopReason(StrEnum):
    SLO_BROKEN = "slo_broken"
    """A level broke the SLO and the bisection found the last one that met it."""
    FIRST_LEVEL_BROKEN = "first_level_broken"
    """Even concurrency 1 broke the SLO."""
    CEILING = "ceiling"
    """The highest concurrency allowed still met the SLO."""


class Climb:
    def __init__(self, *, start: int = 1, ceiling: int, precision: float = 0.0) -> None:
        if start < 1 or ceiling < start:
            raise ValueError("need 1 <= start <= ceiling")
        if not 0 <= precision < 1:
            raise ValueError("precision must lie in [0, 1)")
        self._ceiling = ceiling
        self._precision = precision
        self._passing = 0
        """The highest level that met the SLO; 0, which needs no measuring, passes."""
        self._failing: int | None = None
        """The lowest level that broke it."""
        self._next: int | None = start

    @property
    def next_level(self) -> int | None:
        """The level to measure next; ``None`` once the climb is over."""
        return self._next

    @property
    def finished(self) -> bool:
        return self._next is None

    @property
    def capacity(self) -> int:
        """The highest level that met the SLO (0 when none did)."""
        return self._passing

    @property
    def failing(self) -> int | None:
        return self._failing

    @property
    def resolution(self) -> int:
        """How far apart passing and failing levels may be when the bisection ends."""
        return max(1, math.floor(self._passing * self._precision))

    @property
    def stop_reason(self) -> StopReason | None:
        if not self.finished:
            return None
        if self._failing is None:
            return StopReason.CEILING
        if self._passing == 0:
            return StopReason.FIRST_LEVEL_BROKEN
        return StopReason.SLO_BROKEN

    @property
    def most_levels_left(self) -> int:
        """The most levels still to measure, the next one included: 0 once the climb is
        over. Never less than what follows, whatever the verdicts turn out to be."""
        if self._next is None:
            return 0
        if self._failing is not None:
            return _most_bisection_steps(self._passing, self._failing, self._precision)
        worst = 0
        passing, level, climbed = self._passing, self._next, 0
        while True:
            climbed += 1
            broken_here = climbed + _most_bisection_steps(passing, level, self._precision)
            worst = max(worst, broken_here)
            if level >= self._ceiling:
                return worst
            passing, level = level, min(level * 2, self._ceiling)

    def record(self, level: int, *, passed: bool) -> None:
        if level != self._next:
            raise ValueError(f"measure level {self._next}, not {level}")
        if passed:
            self._passing = max(self._passing, level)
        elif self._failing is None or level < self._failing:
            self._failing = level
        self._next = self._choose_next()

    def _choose_next(self) -> int | None:
        if self._failing is None:
            if self._passing >= self._ceiling:
                return None
            return min(self._passing * 2, self._ceiling)
        if self._failing - self._passing <= self.resolution:
            return None
        return (self._passing + self._failing) // 2


def _most_bisection_steps(passing: int, failing: int, precision: float) -> int:
    """The most levels a bisection between ``passing`` and ``failing`` measures. Each level
    leaves at most the larger half of the gap, and the resolution only grows as the
    passing level does, so halving against today's resolution never counts too few."""
    resolution = max(1, math.floor(passing * precision))
    gap, steps = failing - passing, 0
    while gap > resolution:
        gap = (gap + 1) // 2
        steps += 1
    return steps
