"""GPU health, debounced: a GPU that keeps changing its mind is held unhealthy. Pure.

Every health change an agent reports becomes an event, and placement acts on it. A GPU
whose health flips every few seconds (a loose riser, a driver in a loop, or an agent that
lies) would otherwise grow the log by an event per flip and have replicas placed on it
and taken off again. So, per GPU:

- a change passes through unless the GPU changed more than ``max_changes`` times within
  ``window_s``;
- past that the GPU is held unhealthy, with the reason "flapping", and what it reports is
  only remembered;
- once it has reported no change for ``stable_s``, it is released: its last reported
  health goes to the log (a recovery, or unhealthy with its own reason).

``now`` is monotonic seconds from the caller, like every clock in a decision. Memory is
bounded by the GPUs a node lists, and by ``max_changes`` times per GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from app.domain.reports import GpuHealth


class FlapPolicy(msgspec.Struct, frozen=True, kw_only=True):
    window_s: float = 60.0
    max_changes: int = 4
    stable_s: float = 120.0


class _Gpu:
    __slots__ = ("changes", "held", "last", "last_change")

    def __init__(self, last: GpuHealth) -> None:
        self.last = last
        self.changes: list[float] = []
        """When it changed within the window, at most ``max_changes + 1`` of them."""
        self.last_change: float | None = None
        self.held = False


class FlapGuard:
    """One node's GPUs."""

    def __init__(self, policy: FlapPolicy | None = None) -> None:
        self._policy = policy or FlapPolicy()
        self._gpus: dict[int, _Gpu] = {}

    def observe(self, reports: Iterable[GpuHealth], now: float) -> list[GpuHealth]:
        """What of ``reports`` the log should hear: changes of GPUs that are not flapping,
        and for a GPU that starts flapping now, its hold."""
        passed: list[GpuHealth] = []
        for report in reports:
            outcome = self._observe_one(report, now)
            if outcome is not None:
                passed.append(outcome)
        return passed

    def health(self, report: GpuHealth) -> GpuHealth:
        """``report`` as the log should see it: unhealthy (flapping) while the GPU is held."""
        gpu = self._gpus.get(report.index)
        return self._hold_of(report, len(gpu.changes)) if gpu and gpu.held else report

    def release(self, now: float) -> list[GpuHealth]:
        """The last reported health of every held GPU that has been stable long enough."""
        released: list[GpuHealth] = []
        for gpu in self._gpus.values():
            quiet_since = gpu.last_change if gpu.last_change is not None else now
            if gpu.held and now - quiet_since >= self._policy.stable_s:
                gpu.held = False
                gpu.changes.clear()
                released.append(gpu.last)
        return released

    def forget(self, indexes: Sequence[int]) -> None:
        """GPUs the node no longer lists."""
        for index in indexes:
            self._gpus.pop(index, None)

    def _observe_one(self, report: GpuHealth, now: float) -> GpuHealth | None:
        gpu = self._gpus.get(report.index)
        if gpu is None:
            self._gpus[report.index] = _Gpu(report)
            return report
        changed = report.healthy != gpu.last.healthy
        gpu.last = report
        if changed:
            gpu.changes.append(now)
            gpu.last_change = now
        horizon = now - self._policy.window_s
        gpu.changes = [t for t in gpu.changes if t > horizon][-(self._policy.max_changes + 1) :]
        if gpu.held:
            return None
        if len(gpu.changes) > self._policy.max_changes:
            gpu.held = True
            return self._hold_of(report, len(gpu.changes))
        return report

    def _hold_of(self, report: GpuHealth, changes: int) -> GpuHealth:
        policy = self._policy
        reason = (
            f"flapping: {changes} health changes within {policy.window_s:g}s; held unhealthy "
            f"until stable for {policy.stable_s:g}s"
        )
        return GpuHealth(index=report.index, uuid=report.uuid, healthy=False, reason=reason)
