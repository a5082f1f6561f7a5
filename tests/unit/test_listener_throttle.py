"""The budget of failed authentications per client address, on a clock the test moves."""

from __future__ import annotations

import pytest

from app.listeners.throttle import FailureBudget, FailureLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def budget(clock: Clock, **limits: float) -> FailureBudget:
    return FailureBudget(FailureLimits(**limits), clock=clock)  # type: ignore[arg-type]


def test_an_address_may_fail_its_burst_then_waits_for_the_refill(clock: Clock) -> None:
    failures = budget(clock, burst=3, per_minute=60)

    spent = [failures.spend("10.0.0.7") for _ in range(5)]

    assert spent == [0, 0, 0, 1.0, 1.0]
    assert failures.wait_s("10.0.0.7") == 1.0
    clock.now += 0.25
    assert failures.wait_s("10.0.0.7") == pytest.approx(0.75)
    clock.now += 0.75
    assert failures.wait_s("10.0.0.7") == 0
    assert failures.spend("10.0.0.7") == 0
    assert failures.spend("10.0.0.7") == pytest.approx(1.0)


def test_the_refill_never_exceeds_the_burst(clock: Clock) -> None:
    failures = budget(clock, burst=2, per_minute=60)
    failures.spend("10.0.0.7")
    clock.now += 3600

    assert [failures.spend("10.0.0.7") for _ in range(3)] == [0, 0, 1.0]


def test_each_address_has_its_own_budget(clock: Clock) -> None:
    failures = budget(clock, burst=1, per_minute=1)
    failures.spend("10.0.0.7")

    assert failures.wait_s("10.0.0.7") == pytest.approx(60)
    assert failures.wait_s("10.0.0.8") == 0
    assert failures.spend("10.0.0.8") == 0


def test_ipv6_addresses_count_by_their_64_and_mapped_ipv4_as_ipv4(clock: Clock) -> None:
    failures = budget(clock, burst=1, per_minute=1)

    failures.spend("2001:db8:1:2::1")
    failures.spend("::ffff:10.0.0.7")

    assert failures.wait_s("2001:db8:1:2:ffff::9") > 0
    assert failures.wait_s("2001:db8:1:3::1") == 0
    assert failures.wait_s("10.0.0.7") > 0


def test_a_flood_of_addresses_keeps_memory_bounded_and_forgets_the_oldest(clock: Clock) -> None:
    failures = budget(clock, burst=1, per_minute=1, max_addresses=100)
    failures.spend("10.0.0.1")

    for n in range(10_000):
        failures.spend(f"2001:db8:{n:x}::1")

    assert len(failures._buckets) == 100
    assert failures.wait_s("10.0.0.1") == 0
    assert failures.wait_s("2001:db8:270f::1") > 0  # the latest is remembered


def test_no_address_counts_as_one_address(clock: Clock) -> None:
    failures = budget(clock, burst=1, per_minute=1)
    failures.spend(None)

    assert failures.wait_s(None) > 0
    assert failures.wait_s("") > 0


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        (FailureLimits(burst=0), "--auth-failure-burst must be at least 1, not 0"),
        (FailureLimits(per_minute=0), "--auth-failures-per-minute must be positive, not 0"),
        (
            FailureLimits(per_minute=float("nan")),
            "--auth-failures-per-minute must be positive, not nan",
        ),
    ],
)
def test_unusable_limits_are_named_by_their_flags(limits: FailureLimits, problem: str) -> None:
    assert limits.problems() == [problem]
