"""When a level may stop because nothing it sends succeeds."""

from __future__ import annotations

import pytest

from cli.bench.total_failure import MIN_FAILURES, TotalFailure


def test_a_lone_client_whose_every_request_failed_stops_at_the_minimum() -> None:
    watch = TotalFailure(1)

    for _ in range(MIN_FAILURES - 1):
        watch.failed(0)
        assert not watch.certain
    watch.failed(0)

    assert watch.certain


def test_a_client_still_waiting_on_its_first_answer_keeps_the_level_going() -> None:
    """Three clients fail at once, again and again; the fourth's long request may still
    succeed, so nothing is certain until it fails too."""
    watch = TotalFailure(4)

    for _ in range(100):
        for client in range(3):
            watch.failed(client)
    assert not watch.certain

    watch.failed(3)
    assert watch.certain


def test_one_success_anywhere_means_the_level_runs_its_course() -> None:
    watch = TotalFailure(2)
    watch.succeeded()

    for _ in range(1000):
        watch.failed(0)
        watch.failed(1)

    assert not watch.certain
    assert not watch.nothing_succeeded


def test_a_level_has_a_client() -> None:
    with pytest.raises(ValueError, match="at least one client"):
        TotalFailure(0)
