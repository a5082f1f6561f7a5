"""What one agent connection may send: token buckets for messages and bytes. Pure.

An honest agent sends a heartbeat every few seconds, a status when a shard changes state
and a result per command: a few messages a second at the most, in bursts when many
engines start together. A connection that sends far more is broken or hostile, and every
message it sends costs the whole control plane (decoding, the fleet view, the log), so
past its budget it is closed. The defaults leave an honest agent two orders of magnitude
of headroom; ``now`` is monotonic seconds, passed in like everything the sessions see.
"""

from __future__ import annotations

import msgspec

MIB = 1024 * 1024


class MessageBudget(msgspec.Struct, frozen=True, kw_only=True):
    """Sustained rates, and the bursts a connection may send above them."""

    messages_per_s: float = 50.0
    message_burst: int = 500
    bytes_per_s: float = 4.0 * MIB
    byte_burst: int = 16 * MIB

    def __post_init__(self) -> None:
        if self.messages_per_s <= 0 or self.bytes_per_s <= 0:
            raise ValueError("a message budget's rates must be positive")
        if self.message_burst < 1 or self.byte_burst < 1:
            raise ValueError("a message budget's bursts must be at least 1")


class TokenBucket:
    """``capacity`` tokens at first, ``rate`` more a second up to it; ``now`` is monotonic
    seconds."""

    __slots__ = ("_capacity", "_last", "_rate", "_tokens")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self._rate = rate
        self._capacity = capacity
        self._tokens = capacity
        self._last = now

    def take(self, amount: float, now: float) -> bool:
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)
        if amount > self._tokens:
            return False
        self._tokens -= amount
        return True

    def seconds_until(self, amount: float) -> float:
        """How long, from the last ``take``, until ``amount`` tokens are there."""
        return max(0.0, amount - self._tokens) / self._rate


class BudgetMeter:
    """One connection's spending; ``spend`` says why it is over budget, or None."""

    def __init__(self, budget: MessageBudget, now: float) -> None:
        self._budget = budget
        self._messages = TokenBucket(budget.messages_per_s, budget.message_burst, now)
        self._bytes = TokenBucket(budget.bytes_per_s, budget.byte_burst, now)

    def spend(self, size: int, now: float) -> str | None:
        budget = self._budget
        if not self._messages.take(1, now):
            return (
                f"over the message budget: more than {budget.messages_per_s:g} messages a "
                f"second (bursts of {budget.message_burst})"
            )
        if not self._bytes.take(size, now):
            return (
                f"over the byte budget: more than {budget.bytes_per_s / MIB:g} MiB a second "
                f"(bursts of {budget.byte_burst / MIB:g} MiB)"
            )
        return None
