"""Connections opening at the hub count until they finish, or until they are too old."""

from __future__ import annotations

import pytest

from app.hub.arrivals import OpeningConnections


def test_a_connection_counts_from_its_accept_until_it_finishes() -> None:
    opening = OpeningConnections(max_age_s=60)
    opening.opened(1, now=0)
    opening.opened(2, now=1)
    assert opening.count(now=2) == 2
    opening.finished(1)
    opening.finished(1)  # finishing twice (handler start, then close) is harmless
    assert opening.count(now=2) == 1


def test_a_connection_whose_handshake_never_finished_stops_counting_at_the_age_limit() -> None:
    opening = OpeningConnections(max_age_s=60)
    opening.opened(1, now=0)
    assert opening.count(now=59.9) == 1
    assert opening.count(now=60) == 0


def test_the_age_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        OpeningConnections(max_age_s=0)
