"""Which lines of a repeated warning (or recorded refusal) to write, so that input a writer
controls cannot flood the log: the one per-key window every such warning uses.

A line about a key (what it is about: a gateway's id and the part of its report refused, a
listener's refusal reason, a certificate and what it claimed) is written at most once a
``interval_s``, with how many of that key went unwritten since its last line: the first
after a quiet interval is written at once, the rest of a burst is in the count of the next.
Keys are bounded: past ``max_keys`` the longest-quiet key is forgotten, so however many
keys the input claims, the memory is bounded (a forgotten key is written again at its next
line, its count lost with it). Pure: ``now`` is monotonic seconds, passed in.

``admit`` is the whole rule. A caller with a rule of its own on top (the hub bounds how many
different keys one certificate has recorded a minute) asks the two steps apart: ``holding``
(the key's window is still open), then, where its own rule holds the line back, ``hold``;
else ``write``. A caller whose condition has ended (a clock set right again) ``forget``s its
key, so that the condition coming back is said at once.
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
        if self.holding(key, now):
            return None
        return self.write(key, now)

    def holding(self, key: Hashable, now: float) -> bool:
        """Whether a line of ``key`` was written within the interval: then this one is not
        written, and is counted (and ``key`` is the last to be forgotten)."""
        known = self._keys.get(key)
        if known is None or now - known.written_at >= self._interval_s:
            return False
        known.unwritten += 1
        self._keys.move_to_end(key)
        return True

    def hold(self, key: Hashable) -> None:
        """Count a line of ``key`` that a rule of the caller's holds back although its
        window is over, so that its next line says it. A key not remembered is not made
        one: the caller's rule bounds what it lets in, and this must not undo it."""
        known = self._keys.get(key)
        if known is not None:
            known.unwritten += 1

    def write(self, key: Hashable, now: float) -> int:
        """Start ``key``'s interval at ``now`` (its line is written), and say how many of
        its lines went unwritten since the last: 0 for a key not remembered."""
        known = self._keys.pop(key, None)
        self._keys[key] = _Key(now)
        while len(self._keys) > self._max_keys:
            self._keys.popitem(last=False)
        return 0 if known is None else known.unwritten

    def forget(self, key: Hashable) -> None:
        """Forget ``key`` (and its count): its next line is written at once, as a new
        key's. For a warning about a condition that has ended: when it comes back, it is
        news."""
        self._keys.pop(key, None)

    def __len__(self) -> int:
        """How many keys are remembered (at most ``max_keys``)."""
        return len(self._keys)
