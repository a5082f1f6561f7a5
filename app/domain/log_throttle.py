"""Which lines of a repeated warning to write, so that input a writer controls cannot
flood the log.

A line about a key (what it is about: a gateway's id and the part of its report refused)
is written at most once a ``interval_s``, with how many of that key went unwritten since
its last line: the first after a quiet interval is written at once, the rest of a burst
is in the count of the next. Keys are bounded: past ``max_keys`` the longest-quiet key is
forgotten, so however many keys the input claims, the memory is bounded (a forgotten key
is written again at its next line). Pure: ``now`` is monotonic seconds, passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

DEFAULT_INTERVAL_S = 60.0
DEFAULT_MAX_KEYS = 1_000


class _Key:
    __slots__ = ("unwritten", "written_at")

    def __init__(self, written_at: float) -> None:
        self.written_at = written_at
        self.unwritten = 0


class LogThrottle:
    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        if interval_s < 0 or max_keys < 1:
            raise ValueError(f"interval_s {interval_s} and max_keys {max_keys} out of range")
        self._interval_s = interval_s
        self._max_keys = max_keys
        self._keys: OrderedDict[Hashable, _Key] = OrderedDict()

    def admit(self, key: Hashable, now: float) -> int | None:
        """None: do not write this line (it is counted). Otherwise write it, saying how
        many lines of ``key`` went unwritten since its last."""
        known = self._keys.get(key)
        if known is None:
            self._keys[key] = _Key(now)
            while len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
            return 0
        self._keys.move_to_end(key)
        if now - known.written_at < self._interval_s:
            known.unwritten += 1
            return None
        unwritten, known.unwritten, known.written_at = known.unwritten, 0, now
        return unwritten

    def __len__(self) -> int:
        """How many keys are remembered (at most ``max_keys``)."""
        return len(self._keys)
