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
