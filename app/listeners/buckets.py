"""Token buckets: a budget spent one token at a time and earned back at a steady rate up to
its burst. ``TokenBucket`` is one; ``KeyedBuckets`` is one per key, bounded. Pure: ``now``
is monotonic seconds, passed in.

``KeyedBuckets`` keeps at most ``max_keys`` buckets, the least recently touched dropped
first. That one is also the fullest (buckets refill with time), so forgetting it gives back
little: a flood of keys costs the flooder its own budget, not the process its memory. The
agent hub's connections per node (``app.hub.reconnects``) and the listeners' failed
authentications per address (``app.listeners.throttle``) are each counted by one.
"""

from __future__ import annotations

from collections import OrderedDict


class TokenBucket:
    """``capacity`` tokens at first, ``rate`` more a second up to it; ``now`` is monotonic
    seconds."""

    __slots__ = ("_capacity", "_last", "_rate", "_tokens")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self._rate = rate
        self._capacity = capacity
        self._tokens = capacity
        self._last = now

    def tokens_at(self, now: float) -> float:
        """The tokens there at ``now``, taking none; a clock that steps back earns none."""
        return min(self._capacity, self._tokens + max(0.0, now - self._last) * self._rate)

    def take(self, amount: float, now: float) -> bool:
        self._tokens = self.tokens_at(now)
        self._last = now
        if amount > self._tokens:
            return False
        self._tokens -= amount
        return True

    def seconds_until(self, amount: float) -> float:
        """How long, from the last ``take``, until ``amount`` tokens are there."""
        return max(0.0, amount - self._tokens) / self._rate


class KeyedBuckets:
    """A ``TokenBucket`` of ``burst`` tokens, earning ``per_second`` back, for each key; at
    most ``max_keys`` of them kept."""

    def __init__(self, *, burst: float, per_second: float, max_keys: int) -> None:
        self._burst = burst
        self._per_second = per_second
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def spend(self, key: str, now: float) -> float:
        """Take a token of ``key``'s: 0 when it had one left, else the seconds until it has
        one again (this spend is refused, and costs nothing)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self._per_second, self._burst, now)
            self._buckets[key] = bucket
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return 0.0 if bucket.take(1, now) else bucket.seconds_until(1)

    def wait_s(self, key: str, now: float) -> float:
        """Seconds from ``now`` until ``key`` has a token; 0 while it has one. It spends
        nothing and touches no bucket."""
        bucket = self._buckets.get(key)
        tokens = self._burst if bucket is None else bucket.tokens_at(now)
        return max(0.0, 1 - tokens) / self._per_second

    def __len__(self) -> int:
        return len(self._buckets)
