"""A connection's message budget, and how often one refusal is recorded."""

from __future__ import annotations

import pytest

from app.hub.budget import MIB, BudgetMeter, MessageBudget
from app.hub.refusals import RefusalThrottle


def test_a_burst_up_to_the_budget_passes_and_the_next_message_does_not() -> None:
    meter = BudgetMeter(MessageBudget(messages_per_s=10, message_burst=5), now=0.0)
    assert [meter.spend(100, 0.0) for _ in range(5)] == [None] * 5
    over = meter.spend(100, 0.0)
    assert over == "over the message budget: more than 10 messages a second (bursts of 5)"


def test_the_budget_refills_at_its_rate() -> None:
    meter = BudgetMeter(MessageBudget(messages_per_s=10, message_burst=5), now=0.0)
    for _ in range(5):
        meter.spend(1, 0.0)
    assert meter.spend(1, 0.05) is not None  # half a message earned
    assert meter.spend(1, 0.2) is None  # two earned
    assert meter.spend(1, 0.2) is None
    assert meter.spend(1, 0.2) is not None


def test_an_honest_agent_heartbeating_every_second_for_an_hour_never_comes_close() -> None:
    meter = BudgetMeter(MessageBudget(), now=0.0)
    assert all(meter.spend(300, float(second)) is None for second in range(3600))


def test_bytes_have_a_budget_of_their_own() -> None:
    budget = MessageBudget(bytes_per_s=1 * MIB, byte_burst=2 * MIB)
    meter = BudgetMeter(budget, now=0.0)
    assert meter.spend(MIB, 0.0) is None
    assert meter.spend(MIB, 0.0) is None
    assert meter.spend(1, 0.0) == "over the byte budget: more than 1 MiB a second (bursts of 2 MiB)"


@pytest.mark.parametrize(
    "settings", [{"messages_per_s": 0}, {"bytes_per_s": -1}, {"message_burst": 0}]
)
def test_a_budget_that_allows_nothing_is_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="budget"):
        MessageBudget(**settings)  # type: ignore[arg-type]


def test_one_refusal_a_minute_is_recorded_with_the_count_of_those_left_out() -> None:
    throttle = RefusalThrottle(interval_s=60)
    assert throttle.admit("serial-1", 0.0) == 0
    assert [throttle.admit("serial-1", t) for t in (1.0, 2.0, 59.0)] == [None, None, None]
    assert throttle.admit("serial-2", 3.0) == 0  # another certificate: its own minute
    assert throttle.admit("serial-1", 61.0) == 3


def test_the_throttle_forgets_the_quietest_keys_past_its_bound() -> None:
    throttle = RefusalThrottle(interval_s=60, max_keys=2)
    throttle.admit("a", 0.0)
    throttle.admit("b", 1.0)
    throttle.admit("c", 2.0)  # "a" is forgotten
    assert throttle.admit("a", 3.0) == 0
    assert throttle.admit("c", 4.0) is None


def test_a_certificate_claiming_a_new_name_each_time_is_recorded_a_few_times_a_minute() -> None:
    throttle = RefusalThrottle(interval_s=60, per_group=3)
    admitted = [throttle.admit(f"claims gpu-{n}", float(n), group="serial-1") for n in range(10)]

    assert admitted == [0, 0, 0, None, None, None, None, None, None, None]
    assert throttle.admit("claims gpu-0", 30.0, group="serial-1") is None  # that claim's minute
    assert throttle.admit("claims gpu-99", 61.0, group="serial-1") == 0  # a minute on
