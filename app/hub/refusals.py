"""How often a refusal is recorded: once a minute per refusal, a few a minute per
certificate. Pure.

Every refused connection is logged, but a refusal recorded as an event for each attempt
would let one stolen certificate, dialling in a loop, grow the log without end. The first
refusal for a key (a certificate and what it claimed) is recorded; later ones within
``interval_s`` are counted, and the count goes with the next one recorded
(``suppressed``). A certificate that claims a new name at every attempt gets at most
``per_group`` recorded a minute all told. Keys are bounded too: past ``max_keys`` the
longest-quiet one is forgotten, so a flood of names cannot exhaust memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_INTERVAL_S = 60.0
DEFAULT_MAX_KEYS = 10_000
DEFAULT_PER_GROUP = 10
DEFAULT_COOL_DOWN_S = 60.0


class _Window:
    __slots__ = ("recorded_at", "suppressed")

    def __init__(self, recorded_at: float) -> None:
        self.recorded_at = recorded_at
        self.suppressed = 0


class RefusalThrottle:
    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_keys: int = DEFAULT_MAX_KEYS,
        per_group: int = DEFAULT_PER_GROUP,
    ) -> None:
        self._interval_s = interval_s
        self._max_keys = max_keys
        self._per_group = per_group
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._groups: OrderedDict[str, list[float]] = OrderedDict()

    def admit(self, key: str, now: float, group: str | None = None) -> int | None:
        """None: do not record this refusal (it is counted). Otherwise record it, with the
        number of refusals for ``key`` left unrecorded since the previous one. ``group``
        (the certificate) bounds how many different keys are recorded a minute."""
        window = self._windows.get(key)
        if window is not None and now - window.recorded_at < self._interval_s:
            window.suppressed += 1
            self._windows.move_to_end(key)
            return None
        if group is not None and not self._group_admits(group, now):
            if window is not None:
                window.suppressed += 1
            return None
        suppressed = window.suppressed if window is not None else 0
        self._windows[key] = _Window(now)
        self._windows.move_to_end(key)
        _bound(self._windows, self._max_keys)
        return suppressed

    def _group_admits(self, group: str, now: float) -> bool:
        recent = [t for t in self._groups.get(group, []) if now - t < self._interval_s]
        admitted = len(recent) < self._per_group
        if admitted:
            recent.append(now)
        self._groups[group] = recent
        self._groups.move_to_end(group)
        _bound(self._groups, self._max_keys)
        return admitted


def _bound(entries: OrderedDict[str, Any], size: int) -> None:
    while len(entries) > size:
        entries.popitem(last=False)


class CoolDown:
    """Nodes cut off for flooding, refused for ``period_s`` afterwards. Without it a
    flooder that dials again at once would cost, per connection, a hello and two events
    (connected, disconnected); refused right after the handshake, it costs a handshake."""

    def __init__(
        self, period_s: float = DEFAULT_COOL_DOWN_S, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self._period_s = period_s
        self._max_keys = max_keys
        self._until: OrderedDict[str, float] = OrderedDict()

    def start(self, key: str, now: float) -> None:
        self._until[key] = now + self._period_s
        self._until.move_to_end(key)
        _bound(self._until, self._max_keys)

    def remaining_s(self, key: str, now: float) -> float | None:
        """Seconds ``key`` is still refused, or None when it may connect."""
        until = self._until.get(key)
        if until is None:
            return None
        if now >= until:
            del self._until[key]
            return None
        return until - now
