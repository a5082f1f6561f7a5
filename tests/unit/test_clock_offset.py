"""Whether a control plane's clock is close enough to the database's to lead: the offset is
read over one round trip, and only an offset surely beyond the bound refuses."""

from __future__ import annotations

import importlib

import pytest

from app.clock_offset import (
    APPEND_CLOCK_SLACK_S,
    MAX_LEADER_CLOCK_OFFSET_S,
    ClockReading,
    leader_clock_problem,
)

DATABASE_NOW = 1_800_000_000.0


def read(offset_s: float, round_trip_s: float = 0.002) -> ClockReading:
    """A reading by a machine ``offset_s`` ahead of the database, the query taking
    ``round_trip_s`` with the database's clock read half way."""
    sent = DATABASE_NOW + offset_s - round_trip_s / 2
    return ClockReading(sent=sent, theirs=DATABASE_NOW, received=sent + round_trip_s)


@pytest.mark.parametrize("offset_s", [0.0, 5.0, -5.0, 29.0, -29.0])
def test_a_clock_within_the_bound_may_lead(offset_s: float) -> None:
    assert read(offset_s).offset_s == pytest.approx(offset_s)
    assert leader_clock_problem(read(offset_s)) is None


def test_a_clock_two_hours_ahead_may_not_lead_and_is_told_which_way() -> None:
    problem = leader_clock_problem(read(7200.0))
    assert problem is not None
    assert problem.startswith("this machine's clock is 7200.0 s ahead of the database's")
    assert "set its clock right (NTP)" in problem


@pytest.mark.parametrize("offset_s", [120.0, -120.0, -7200.0])
def test_a_clock_minutes_or_hours_behind_or_ahead_may_not_lead(offset_s: float) -> None:
    problem = leader_clock_problem(read(offset_s))
    assert problem is not None
    assert ("ahead of" if offset_s > 0 else "behind") in problem


def test_an_offset_the_round_trip_could_explain_is_not_held_against_the_clock() -> None:
    # 31 s off by the midpoint, but the query took 4 s: the database's clock was read
    # somewhere in those 4 s, so the offset may be as little as 29 s.
    assert leader_clock_problem(read(31.0, round_trip_s=4.0)) is None
    assert leader_clock_problem(read(33.0, round_trip_s=4.0)) is not None


def test_the_bound_leaves_room_inside_the_append_s_own_slack() -> None:
    migration = importlib.import_module("app.migrations.versions.0017_append_guards_time_and_rows")
    assert migration.SLACK_S == APPEND_CLOCK_SLACK_S
    assert 0 < MAX_LEADER_CLOCK_OFFSET_S < APPEND_CLOCK_SLACK_S
