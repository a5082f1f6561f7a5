"""How often a listener's sweep looks for late connections: a quarter of its shortest
time, the keep-alive time among them, a second at most."""

from __future__ import annotations

from app.listeners.limits import ListenerLimits, sweep_period_s

SLOW = ListenerLimits(header_timeout_s=10.0, body_timeout_s=60.0, send_timeout_s=60.0)


def test_long_times_are_swept_once_a_second() -> None:
    assert sweep_period_s(SLOW, keep_alive_s=5.0) == 1.0


def test_a_short_keep_alive_time_is_swept_every_quarter_of_it() -> None:
    """A 0.2 s keep-alive swept once a second would close an idle connection up to 1.2 s
    after its last answer; swept every 0.05 s, within 0.25 s."""
    assert sweep_period_s(SLOW, keep_alive_s=0.2) == 0.05


def test_a_short_header_timeout_is_swept_every_quarter_of_it() -> None:
    short_head = ListenerLimits(header_timeout_s=0.4, body_timeout_s=60.0)
    assert sweep_period_s(short_head, keep_alive_s=5.0) == 0.1
