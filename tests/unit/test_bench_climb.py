"""The climb: doubling until a level breaks the SLO, then bisecting to the capacity."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.bench.climb import Climb, StopReason


def climb_against(capacity: int, climb: Climb) -> list[int]:
    """Run ``climb`` against an engine that meets the SLO up to ``capacity``; the levels
    measured, in order."""
    measured = []
    while (level := climb.next_level) is not None:
        measured.append(level)
        climb.record(level, passed=level <= capacity)
    return measured


def test_it_doubles_until_a_level_breaks_then_bisects() -> None:
    climb = Climb(ceiling=1024)

    assert climb_against(11, climb) == [1, 2, 4, 8, 16, 12, 10, 11]
    assert climb.capacity == 11
    assert climb.stop_reason is StopReason.SLO_BROKEN
    assert climb.failing == 12


def test_precision_ends_the_bisection_when_levels_are_close_enough() -> None:
    climb = Climb(ceiling=4096, precision=0.05)

    measured = climb_against(700, climb)

    # 672 passes and 704 breaks: 32 apart, within 5 % of 672, so 688 is not worth a level.
    assert measured == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 768, 640, 704, 672]
    assert climb.capacity == 672
    assert climb.resolution == 33
    assert climb.failing == 704


def test_when_the_ceiling_still_meets_the_slo_the_capacity_is_a_lower_bound() -> None:
    climb = Climb(ceiling=12)

    assert climb_against(100, climb) == [1, 2, 4, 8, 12]
    assert climb.capacity == 12
    assert climb.stop_reason is StopReason.CEILING


def test_when_concurrency_one_breaks_the_capacity_is_zero() -> None:
    climb = Climb(ceiling=64)

    assert climb_against(0, climb) == [1]
    assert climb.capacity == 0
    assert climb.stop_reason is StopReason.FIRST_LEVEL_BROKEN


def test_a_first_level_that_breaks_is_bisected_towards_zero() -> None:
    climb = Climb(start=16, ceiling=64)

    assert climb_against(5, climb) == [16, 8, 4, 6, 5]
    assert climb.capacity == 5
    assert climb.stop_reason is StopReason.SLO_BROKEN


def test_only_the_level_it_named_can_be_recorded() -> None:
    climb = Climb(ceiling=8)

    with pytest.raises(ValueError, match="measure level 1, not 2"):
        climb.record(2, passed=True)


@given(
    capacity=st.integers(min_value=0, max_value=5000),
    start=st.integers(min_value=1, max_value=64),
    ceiling=st.integers(min_value=64, max_value=4096),
    precision=st.sampled_from([0.0, 0.05, 0.1]),
)
def test_the_climb_finds_the_capacity_to_within_its_resolution(
    capacity: int, start: int, ceiling: int, precision: float
) -> None:
    climb = Climb(start=start, ceiling=ceiling, precision=precision)

    measured = climb_against(capacity, climb)

    expected = min(capacity, ceiling)
    assert climb.capacity <= expected
    assert expected - climb.capacity <= climb.resolution
    assert len(measured) == len(set(measured))
    assert all(1 <= level <= ceiling for level in measured)


def test_the_levels_left_are_bounded_before_the_first_and_tighten_as_it_goes() -> None:
    climb = Climb(ceiling=256, precision=0.05)

    assert climb.most_levels_left == 14  # 1 to 256 is 9 levels; 256 breaking bisects 5 more
    climb.record(1, passed=True)
    assert climb.most_levels_left == 13
    for level in (2, 4, 8, 16):
        climb.record(level, passed=True)
    climb.record(32, passed=False)  # 16 to 32: 24, 20, 18, 17 at most
    assert climb.most_levels_left == 4
    assert climb_against(17, climb) == [24, 20, 18, 17]
    assert climb.most_levels_left == 0


def test_a_climb_that_may_reach_the_ceiling_alone_counts_its_doublings() -> None:
    assert Climb(ceiling=1).most_levels_left == 1
    assert Climb(start=4, ceiling=4).most_levels_left == 3  # 4 breaks: 2, then 1 or 3


@given(
    verdicts=st.lists(st.booleans(), min_size=40, max_size=40),
    start=st.integers(min_value=1, max_value=64),
    ceiling=st.integers(min_value=64, max_value=4096),
    precision=st.sampled_from([0.0, 0.05, 0.1]),
)
def test_no_sequence_of_verdicts_measures_more_levels_than_were_left(
    verdicts: list[bool], start: int, ceiling: int, precision: float
) -> None:
    """Verdicts in any order, as a noisy engine gives them, not only a clean capacity."""
    climb = Climb(start=start, ceiling=ceiling, precision=precision)
    bounds = []
    measured = 0
    for passed in verdicts:
        if climb.next_level is None:
            break
        bounds.append(climb.most_levels_left)
        climb.record(climb.next_level, passed=passed)
        measured += 1

    assert climb.finished
    assert climb.most_levels_left == 0
    assert all(bound >= measured - done for done, bound in enumerate(bounds))
    assert all(later <= earlier - 1 for earlier, later in itertools.pairwise(bounds))


@pytest.mark.parametrize(
    ("start", "ceiling", "precision"), [(1, 256, 0.05), (1, 256, 0.0), (3, 100, 0.1), (1, 16, 0.05)]
)
def test_some_capacity_takes_as_many_levels_as_the_bound_says(
    start: int, ceiling: int, precision: float
) -> None:
    """The bound is the worst case over every clean capacity, not a loose guess."""
    bound = Climb(start=start, ceiling=ceiling, precision=precision).most_levels_left
    taken = [
        len(climb_against(capacity, Climb(start=start, ceiling=ceiling, precision=precision)))
        for capacity in range(ceiling + 2)
    ]

    assert max(taken) == bound
