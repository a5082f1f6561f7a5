"""A GPU that keeps changing its mind is held unhealthy, then released once stable."""

from __future__ import annotations

from app.domain.gpu_flaps import FlapGuard, FlapPolicy
from app.domain.reports import GpuHealth

POLICY = FlapPolicy(window_s=10, max_changes=3, stable_s=30)


def health(healthy: bool, reason: str | None = None) -> GpuHealth:
    return GpuHealth(
        index=0, uuid="GPU-0", healthy=healthy, reason=reason or (None if healthy else "xid 79")
    )


def flip(guard: FlapGuard, times: int, start: float = 1.0) -> list[GpuHealth]:
    passed: list[GpuHealth] = []
    for n in range(times):
        passed += guard.observe([health(n % 2 == 1)], start + n * 0.1)
    return passed


def test_occasional_changes_pass_through() -> None:
    guard = FlapGuard(POLICY)
    guard.observe([health(True)], 0.0)

    assert guard.observe([health(False)], 1.0) == [health(False)]
    assert guard.observe([health(True)], 20.0) == [health(True)]
    assert guard.release(100.0) == []


def test_a_flapping_gpu_is_held_unhealthy_with_one_report_however_often_it_flips() -> None:
    guard = FlapGuard(POLICY)
    guard.observe([health(True)], 0.0)

    passed = flip(guard, 170)

    assert [p.healthy for p in passed] == [False, True, False, False]
    held = passed[-1]
    assert held.reason == (
        "flapping: 4 health changes within 10s; held unhealthy until stable for 30s"
    )
    assert guard.health(health(True)).healthy is False  # a hello is told the same


def test_a_held_gpu_is_released_with_its_last_health_once_stable() -> None:
    guard = FlapGuard(POLICY)
    guard.observe([health(True)], 0.0)
    flip(guard, 10)  # ends healthy at about t=1.9
    assert guard.release(20.0) == []  # not stable long enough

    assert guard.release(32.0) == [health(True)]
    assert guard.health(health(True)).healthy is True
    assert guard.release(40.0) == []


def test_a_change_while_held_restarts_the_stable_period() -> None:
    guard = FlapGuard(POLICY)
    guard.observe([health(True)], 0.0)
    flip(guard, 10)
    assert guard.observe([health(False)], 25.0) == []

    assert guard.release(50.0) == []
    assert guard.release(55.0) == [health(False)]


def test_gpus_are_judged_one_by_one() -> None:
    guard = FlapGuard(POLICY)
    other = GpuHealth(index=1, uuid="GPU-1", healthy=True)
    guard.observe([health(True), other], 0.0)
    flip(guard, 10)

    assert guard.observe([GpuHealth(index=1, uuid="GPU-1", healthy=False, reason="x")], 3.0) == [
        GpuHealth(index=1, uuid="GPU-1", healthy=False, reason="x")
    ]


def test_a_gpu_no_longer_listed_is_forgotten_hold_and_all() -> None:
    guard = FlapGuard(POLICY)
    other = GpuHealth(index=1, uuid="GPU-1", healthy=True)
    guard.observe([health(True), other], 0.0)
    flip(guard, 10)

    guard.retain([other])

    assert len(guard) == 1
    assert guard.health(health(True)).healthy is True  # judged afresh if it comes back
    assert guard.release(100.0) == []


def test_a_held_gpu_numbered_anew_keeps_its_hold_and_the_gpu_under_its_old_index_has_none() -> None:
    """After a driver reload the held GPU is listed under index 1, and another under 0."""
    guard = FlapGuard(POLICY)
    guard.observe([health(True)], 0.0)
    flip(guard, 10)
    moved = GpuHealth(index=1, uuid="GPU-0", healthy=True)
    newcomer = GpuHealth(index=0, uuid="GPU-7", healthy=True)

    guard.retain([newcomer, moved])

    assert guard.health(newcomer) == newcomer
    held = guard.health(moved)
    assert (held.index, held.uuid, held.healthy) == (1, "GPU-0", False)
    assert str(held.reason).startswith("flapping")
    assert guard.release(100.0) == [moved], "released under the index it is listed at"


def test_a_guard_has_settled_once_no_gpu_changed_for_the_window_and_the_stable_period() -> None:
    guard = FlapGuard(POLICY)
    guard.observe([health(True)], 0.0)
    assert guard.settled(0.0), "a GPU seen once, never changed"

    flip(guard, 10)  # the last change at about t=1.9, held
    assert not guard.settled(1.9 + POLICY.stable_s - 1)
    assert guard.settled(1.9 + POLICY.memory_s)
    assert POLICY.memory_s == max(POLICY.window_s, POLICY.stable_s)
