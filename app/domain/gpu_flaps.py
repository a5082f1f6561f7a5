"""GPU health, debounced: a GPU that keeps changing its mind is held unhealthy. Pure.

Every health change an agent reports becomes an event, and placement acts on it. A GPU
whose health flips every few seconds (a loose riser, a driver in a loop, or an agent that
lies) would otherwise grow the log by an event per flip and have replicas placed on it
and taken off again. So, per GPU (known by its UUID, so that a hold follows a GPU a driver
reload numbered anew, and stays off another GPU listed under its old index: ``retain``):

- a change passes through unless the GPU changed more than ``max_changes`` times within
  ``window_s``;
- past that the GPU is held unhealthy, with the reason "flapping", and what it reports is
  only remembered;
- once it has reported no change for ``stable_s``, it is released: its last reported
  health goes to the log (a recovery, or unhealthy with its own reason).

``now`` is monotonic seconds from the caller, like every clock in a decision. Memory is
bounded by the GPUs a node lists (``retain`` forgets the others at each hello, and the hub
passes on no change of a GPU its hello did not list), and by ``max_changes`` times per GPU.
Once no GPU has changed for ``memory_s``, nothing the guard remembers would change what it
decides (a hold would be released at the next heartbeat): the guard of a node gone that
long can be dropped (``settled``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import msgspec

from app.domain.gpu_identity import known_as
from app.domain.reports import GpuHealth


class FlapPolicy(msgspec.Struct, frozen=True, kw_only=True):
    window_s: float = 60.0
    max_changes: int = 4
    stable_s: float = 120.0

    @property
    def memory_s(self) -> float:
        """How long a change matters: to the window it counts in, and to a hold's release."""
        return max(self.window_s, self.stable_s)


class _Gpu:
    __slots__ = ("changes", "held", "last", "last_change")

    def __init__(self, last: GpuHealth) -> None:
        self.last = last
        self.changes: list[float] = []
        """When it changed within the window, at most ``max_changes + 1`` of them."""
        self.last_change: float | None = None
        self.held = False

    @property
    def index(self) -> int:
        return self.last.index

    @property
    def uuid(self) -> str:
        return self.last.uuid


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

    def retain(self, listed: Collection[GpuHealth]) -> None:
        """Forget every GPU but the ones the node lists now, and remember each under the
        index it is listed at. A GPU is known by its UUID (``app.domain.gpu_identity``):
        one a driver reload numbered anew keeps its hold under its new index, and another
        GPU listed under its old index is judged afresh."""
        listed_uuids = frozenset(gpu.uuid for gpu in listed if gpu.uuid)
        remembered = list(self._gpus.values())
        kept: dict[int, _Gpu] = {}
        for gpu in listed:
            known = known_as(gpu, remembered, listed_uuids)
            if known is not None:
                known.last = msgspec.structs.replace(known.last, index=gpu.index, uuid=gpu.uuid)
                kept[gpu.index] = known
        self._gpus = kept

    def settled(self, now: float) -> bool:
        """True when no GPU changed within ``memory_s``: a new guard would decide alike."""
        memory_s = self._policy.memory_s
        return all(
            gpu.last_change is None or now - gpu.last_change >= memory_s
            for gpu in self._gpus.values()
        )

    def __len__(self) -> int:
        return len(self._gpus)

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
