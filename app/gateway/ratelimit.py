"""Per-key requests-per-minute and tokens-per-minute limits over a sliding window.

The window is approximated from two fixed buckets, as most gateways do: the count of the
previous bucket weighted by how much of it the sliding window still covers, plus the
count of the current one. Each bucket also keeps when its first and last events came, and
the weight is taken over that span rather than the whole bucket, so an event is forgotten
at most one window after it came: what the headers advertise (``Retry-After``,
``x-ratelimit-reset-*``) is never more than the window, and is when it really happens.
Four numbers per key and limit, O(1) per request.

A request is admitted when one more request fits under ``rpm`` and at least one token is
left under ``tpm``: tokens are only known once the answer is over, so they are charged
afterwards with ``record_tokens`` (a burst of concurrent requests can overshoot ``tpm`` by
what they generate; the next ones wait for it). Refused requests are not counted.

Pure: ``now`` (seconds, any monotonic origin) is always a parameter.
"""

from __future__ import annotations

import math
from typing import Protocol

import msgspec

WINDOW_S = 60.0
_SWEEP_EVERY = 4096
_EPSILON = 1e-9


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """One limit as the ``x-ratelimit-*`` headers tell it."""

    limit: int
    remaining: int
    reset_s: float
    """Seconds until the window no longer holds anything of what it counts now."""


class RateDecision(msgspec.Struct, frozen=True, kw_only=True):
    allowed: bool
    retry_after_s: float
    """0 when allowed; else seconds until this request would fit, if nothing else comes."""
    requests: Quota | None
    """``None`` when the key has no rpm limit."""
    tokens: Quota | None
    """``None`` when the key has no tpm limit."""
    reserved_tokens: int = 0
    """Tokens taken at admission (an estimate), to settle with ``record_tokens``."""
    pending: bool = False
    """Not allowed yet, but a grant that may cover it is on its way: ``await
    limiter.answered()`` and ask again (``app.gateway.sharedlimits``)."""


ALLOWED_UNLIMITED = RateDecision(allowed=True, retry_after_s=0.0, requests=None, tokens=None)


class SlidingCount:
    """Events in the last ``window_s`` seconds, approximated from two fixed buckets.

    Each bucket keeps its count and the span its events took (first and last). The events
    of the previous bucket are taken as spread evenly over that span, so they leave the
    window as the window's start passes over it, and the last one leaves exactly a window
    after it came: nothing counts for longer than the window.
    """

    __slots__ = (
        "_bucket",
        "_current",
        "_current_first",
        "_current_last",
        "_previous",
        "_previous_first",
        "_previous_last",
        "_window_s",
    )

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._bucket = -1
        self._current = 0.0
        self._current_first = self._current_last = 0.0
        self._previous = 0.0
        self._previous_first = self._previous_last = 0.0

    def add(self, amount: float, now: float) -> None:
        self._roll(now)
        if self._current == 0:
            self._current_first = self._current_last = now
        elif now > self._current_last:
            self._current_last = now
        self._current += amount

    def estimate(self, now: float) -> float:
        self._roll(now)
        if self._previous == 0:
            return self._current
        return self._previous * self._previous_share(now) + self._current

    def fits(self, cost: float, limit: float, now: float) -> bool:
        return self.estimate(now) + cost <= limit + _EPSILON

    def wait_for_room(self, cost: float, limit: float, now: float) -> float:
        """Seconds until ``cost`` more fits under ``limit`` if nothing else is added: at
        most the window."""
        if self.fits(cost, limit, now):
            return 0.0
        if cost > limit:
            return self._window_s  # never fits; ask again in a window
        room = limit - cost
        if self._current <= room:
            # The previous bucket leaves the window before the current one does.
            fits_at = _leaves_window_at(
                self._previous_first,
                self._previous_last,
                (room - self._current) / self._previous,
                self._window_s,
            )
        else:
            # Only once this bucket's own events have begun to leave the window.
            fits_at = _leaves_window_at(
                self._current_first, self._current_last, room / self._current, self._window_s
            )
        return min(self._window_s, max(0.0, fits_at - now))

    def reset_s(self, now: float) -> float:
        """Seconds until nothing counted now is left in the window: at most the window."""
        self._roll(now)
        if self._current > 0:
            last = self._current_last
        elif self._previous > 0:
            last = self._previous_last
        else:
            return 0.0
        return min(self._window_s, max(0.0, last + self._window_s - now))

    def idle(self, now: float) -> bool:
        return self.estimate(now) == 0

    def _previous_share(self, now: float) -> float:
        """How much of the previous bucket's count the window still holds."""
        start = now - self._window_s
        if start < self._previous_first:
            return 1.0
        if start >= self._previous_last:
            return 0.0
        span = self._previous_last - self._previous_first
        return (self._previous_last - start) / span

    def _roll(self, now: float) -> None:
        bucket = math.floor(now / self._window_s)
        if bucket == self._bucket:
            return
        if bucket == self._bucket + 1:
            self._previous = self._current
            self._previous_first, self._previous_last = self._current_first, self._current_last
        else:
            self._previous = 0.0
        self._current = 0.0
        self._current_first = self._current_last = 0.0
        self._bucket = bucket


def _leaves_window_at(first: float, last: float, share: float, window_s: float) -> float:
    """When the window's share of events spread evenly over ``[first, last]`` falls to
    ``share`` (0 <= share < 1)."""
    return last + window_s - share * (last - first)


class _KeyUsage:
    __slots__ = ("requests", "tokens")

    def __init__(self, window_s: float) -> None:
        self.requests = SlidingCount(window_s)
        self.tokens = SlidingCount(window_s)


class Limiter(Protocol):
    """What the gateway asks of a limiter: ``RateLimiter`` counts on this gateway alone,
    ``app.gateway.sharedlimits.SharedLimiter`` across every gateway."""

    def admit(
        self, key_id: str, *, rpm: int | None, tpm: int | None, now: float, tokens: int = 1
    ) -> RateDecision: ...

    def record_tokens(self, key_id: str, tokens: int, *, now: float, reserved: int = 0) -> None: ...

    async def answered(self, within_s: float) -> None:
        """Until the next answer to a grant asked for, or ``within_s``."""
        ...


class RateLimiter:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._usage: dict[str, _KeyUsage] = {}
        self._until_sweep = _SWEEP_EVERY

    def admit(
        self, key_id: str, *, rpm: int | None, tpm: int | None, now: float, tokens: int = 1
    ) -> RateDecision:
        """Admit one request of ``key_id`` and count it, or say how long to wait. Its
        ``tokens`` estimate is not reserved here: tokens are charged once known."""
        if rpm is None and tpm is None:
            return ALLOWED_UNLIMITED
        self._maybe_sweep(now)
        usage = self._usage_of(key_id)
        waits = [0.0]
        if rpm is not None:
            waits.append(usage.requests.wait_for_room(1.0, rpm, now))
        if tpm is not None:
            waits.append(usage.tokens.wait_for_room(1.0, tpm, now))
        retry_after_s = max(waits)
        allowed = retry_after_s == 0.0
        if allowed and rpm is not None:
            usage.requests.add(1.0, now)
        return RateDecision(
            allowed=allowed,
            retry_after_s=retry_after_s,
            requests=None if rpm is None else _quota(usage.requests, rpm, now),
            tokens=None if tpm is None else _quota(usage.tokens, tpm, now),
        )

    def record_tokens(self, key_id: str, tokens: int, *, now: float, reserved: int = 0) -> None:
        """Charge the tokens an answer used (prompt and completion) to ``key_id``; nothing
        was reserved here, so ``reserved`` is ignored."""
        if tokens > 0:
            self._usage_of(key_id).tokens.add(float(tokens), now)

    async def answered(self, within_s: float) -> None:
        """Nothing is ever pending here."""

    def tracked_keys(self) -> int:
        return len(self._usage)

    def forget_idle(self, now: float) -> None:
        """Drop the counts of keys that the window no longer holds anything of."""
        self._usage = {
            key: usage
            for key, usage in self._usage.items()
            if not (usage.requests.idle(now) and usage.tokens.idle(now))
        }

    def _usage_of(self, key_id: str) -> _KeyUsage:
        usage = self._usage.get(key_id)
        if usage is None:
            usage = self._usage[key_id] = _KeyUsage(self._window_s)
        return usage

    def _maybe_sweep(self, now: float) -> None:
        self._until_sweep -= 1
        if self._until_sweep <= 0:
            self._until_sweep = _SWEEP_EVERY
            self.forget_idle(now)


def _quota(count: SlidingCount, limit: int, now: float) -> Quota:
    return Quota(
        limit=limit,
        remaining=max(0, math.floor(limit - count.estimate(now) + _EPSILON)),
        reset_s=count.reset_s(now),
    )
