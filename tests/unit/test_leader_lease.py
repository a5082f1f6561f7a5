"""The leader lease outlasts the time a leader takes to find out it cannot reach its lock's
session, so a leader cut off from the database has stopped leading before PostgreSQL ends
that session and a standby can take over."""

from __future__ import annotations

import pytest

from app.services.leader import DEFAULT_LEASE_S, LeaderElection

URL = "postgresql://llmgw@db.invalid/llmgw"


def test_the_default_lease_outlasts_the_default_check() -> None:
    """The defaults are accepted (the constructor refuses a lease that is too short)."""
    assert LeaderElection(URL, "cp-1").holder_id == "cp-1"
    assert LeaderElection(URL, "cp-1", lease_s=DEFAULT_LEASE_S).holder_id == "cp-1"


def test_a_lease_a_cut_off_leader_could_outlive_is_refused() -> None:
    with pytest.raises(ValueError, match="check interval and timeout together"):
        LeaderElection(URL, "cp-1", check_interval_s=1.0, check_timeout_s=5.0, lease_s=6.0)


def test_a_lease_a_standby_would_sit_idle_through_is_refused() -> None:
    with pytest.raises(ValueError, match="retry interval"):
        LeaderElection(URL, "cp-1", retry_interval_s=12.0, lease_s=10.0)


@pytest.mark.parametrize("lease", [float("nan"), float("inf"), 3601.0])
def test_a_lease_that_is_not_a_number_or_would_hold_a_frozen_leader_for_hours_is_refused(
    lease: float,
) -> None:
    with pytest.raises(ValueError, match="at most 3600s"):
        LeaderElection(URL, "cp-1", lease_s=lease)
