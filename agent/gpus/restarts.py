"""When the NVML source may start NVML again after NVML lost the driver.

A reloaded or upgraded driver leaves NVML answering ``Uninitialized`` or ``Driver Not
Loaded`` to every call until it is shut down and initialised again; ``nvmlInit`` itself
keeps failing while the driver is still away. Trying on every poll would spin on a
machine whose driver is gone for good, so each failed start doubles the wait, up to a
ceiling, and a start that reads the GPUs again resets it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

FIRST_RESTART_DELAY = timedelta(seconds=5)
LONGEST_RESTART_DELAY = timedelta(minutes=5)


class RestartBackoff:
    def __init__(
        self,
        first: timedelta = FIRST_RESTART_DELAY,
        longest: timedelta = LONGEST_RESTART_DELAY,
    ) -> None:
        if first <= timedelta(0) or longest < first:
            raise ValueError(f"restart delays must grow from above 0: {first} to {longest}")
        self._first = first
        self._longest = longest
        self._delay = first
        self._next: datetime | None = None

    def failed(self, now: datetime) -> None:
        """NVML was lost, or a start failed, at ``now``: wait before the next start."""
        self._next = now + self._delay
        self._delay = min(self._delay * 2, self._longest)

    def due(self, now: datetime) -> bool:
        return self._next is None or now >= self._next

    def succeeded(self) -> None:
        self._delay = self._first
        self._next = None
