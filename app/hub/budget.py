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

from app.listeners.buckets import TokenBucket

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
