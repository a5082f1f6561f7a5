"""How often one node may connect: its burst, the rate it earns connections back at, and the
bound on what the hub remembers. Every clock here is a number the test chooses."""

from __future__ import annotations

import pytest

from app.hub.reconnects import ConnectBudget, ConnectLimits


def test_ten_connections_at_once_pass_and_the_eleventh_waits_six_seconds() -> None:
    budget = ConnectBudget()
    assert [budget.spend("gpu-7", 100.0) for _ in range(10)] == [0.0] * 10
    assert budget.spend("gpu-7", 100.0) == pytest.approx(6.0)
    assert budget.spend("gpu-7", 103.0) == pytest.approx(3.0)  # a refusal costs no token


def test_a_node_earns_ten_connections_a_minute_back_and_no_more_than_its_burst() -> None:
    budget = ConnectBudget()
    for _ in range(10):
        budget.spend("gpu-7", 0.0)
    assert budget.spend("gpu-7", 6.0) == 0.0
    assert budget.spend("gpu-7", 6.0) > 0
    assert [budget.spend("gpu-7", 3600.0) for _ in range(10)] == [0.0] * 10
    assert budget.spend("gpu-7", 3600.0) > 0  # an hour away earns a burst, not 360


def test_each_node_has_a_budget_of_its_own() -> None:
    budget = ConnectBudget(ConnectLimits(burst=1, per_minute=1))
    assert budget.spend("gpu-7", 0.0) == 0.0
    assert budget.spend("gpu-7", 0.0) == pytest.approx(60.0)
    assert budget.spend("gpu-8", 0.0) == 0.0


def test_an_agent_backing_off_as_agents_do_is_never_refused() -> None:
    """The agent's backoff doubles from half a second to 30 s while its server keeps closing
    it; reset after a connection that lasted 10 s, it starts over from the top."""
    budget = ConnectBudget()
    now = 0.0
    for _ in range(20):
        for delay in (0.5, 1, 2, 4, 8, 16, 30, 30, 30):
            assert budget.spend("gpu-7", now) == 0.0
            now += delay
        now += 10.0  # one connection that stayed up: the backoff starts over


def test_the_budget_forgets_the_quietest_nodes_past_its_bound() -> None:
    budget = ConnectBudget(ConnectLimits(burst=1, per_minute=1, max_nodes=2))
    budget.spend("a", 0.0)
    budget.spend("b", 1.0)
    budget.spend("c", 2.0)
    assert len(budget) == 2
    assert budget.spend("b", 2.0) > 0  # remembered
    assert budget.spend("a", 2.0) == 0.0  # forgotten: a full burst again


def test_a_clock_that_steps_back_earns_nothing() -> None:
    budget = ConnectBudget(ConnectLimits(burst=1, per_minute=1))
    budget.spend("gpu-7", 100.0)
    assert budget.spend("gpu-7", 50.0) > 0


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"burst": 0}, "--agent-connect-burst must be at least 1, not 0"),
        ({"per_minute": 0}, "--agent-connects-per-minute must be positive, not 0"),
        ({"per_minute": float("inf")}, "--agent-connects-per-minute must be positive, not inf"),
        ({"per_minute": float("nan")}, "--agent-connects-per-minute must be positive, not nan"),
    ],
)
def test_limits_that_allow_nothing_are_refused(limits: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ConnectLimits(**limits)  # type: ignore[arg-type]


def test_the_limits_describe_themselves_for_a_close_reason() -> None:
    assert ConnectLimits().describe() == "at most 10 connections a minute (bursts of 10)"
