"""Which lines of a repeated warning are written: once a key a minute, with how many went
unwritten since, and a bounded memory of keys however many the input claims."""

from __future__ import annotations

import pytest

from app.domain.log_throttle import LogThrottle


def test_a_key_is_written_once_an_interval_with_how_many_went_unwritten() -> None:
    throttle = LogThrottle(interval_s=60.0)

    assert throttle.admit(("gw-a", "queued"), 0.0) == 0
    assert [throttle.admit(("gw-a", "queued"), t) for t in (1.0, 30.0, 59.9)] == [None] * 3
    assert throttle.admit(("gw-a", "ejected"), 1.0) == 0  # another part: a line of its own
    assert throttle.admit(("gw-a", "queued"), 60.0) == 3
    assert throttle.admit(("gw-a", "queued"), 61.0) is None
    assert throttle.admit(("gw-a", "queued"), 500.0) == 1  # after a quiet spell: at once


def test_keys_are_bounded_the_longest_quiet_forgotten_first() -> None:
    throttle = LogThrottle(interval_s=60.0, max_keys=3)
    throttle.admit("loud", 0.0)
    for n in range(1_000):
        throttle.admit(f"claimed-{n}", 1.0)
        throttle.admit("loud", 1.0)  # kept: never the longest quiet

    assert len(throttle) == 3
    assert throttle.admit("loud", 2.0) is None
    assert throttle.admit("claimed-0", 2.0) == 0  # forgotten: written again, as new


@pytest.mark.parametrize(("interval_s", "max_keys"), [(-1.0, 10), (60.0, 0)])
def test_a_throttle_out_of_range_is_refused(interval_s: float, max_keys: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        LogThrottle(interval_s, max_keys)


def test_a_line_held_back_by_the_callers_rule_is_in_the_count_of_the_next() -> None:
    """The hub bounds what one certificate records: a key whose window is over may be held."""
    throttle = LogThrottle(interval_s=60.0)
    assert throttle.write("claims gpu-1", 0.0) == 0
    assert throttle.holding("claims gpu-1", 30.0)  # its window: counted here

    assert not throttle.holding("claims gpu-1", 61.0)
    throttle.hold("claims gpu-1")  # the caller's rule said no
    assert throttle.write("claims gpu-1", 62.0) == 2


def test_a_key_held_back_before_it_is_remembered_is_not_made_one() -> None:
    throttle = LogThrottle(interval_s=60.0, max_keys=1)
    throttle.write("remembered", 0.0)

    throttle.hold("claims gpu-9")

    assert len(throttle) == 1
    assert throttle.holding("remembered", 1.0)  # not forgotten for a key held back
    assert throttle.write("claims gpu-9", 2.0) == 0


def test_a_forgotten_key_is_written_at_once_its_count_gone() -> None:
    """A warning about a condition that ended (a clock set right) is news when it returns."""
    throttle = LogThrottle(interval_s=60.0)
    assert throttle.admit("clock off", 0.0) == 0
    assert throttle.admit("clock off", 1.0) is None

    throttle.forget("clock off")
    throttle.forget("never seen")  # nothing to forget: nothing changes

    assert throttle.admit("clock off", 2.0) == 0
    assert len(throttle) == 1
