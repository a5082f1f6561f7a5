"""Each replica's requests as this gateway sees them, over a sliding window, for its report.

    window = TrafficWindow()                      # 60 s, in 12 slots of 5 s
    window.record("llama-1", Outcome.ANSWERED, ttft_s=0.18, tpot_s=0.02, latency_s=1.9)
    window.report()      # {"llama-1": ReplicaTraffic(requests=1, ...)}, what the window holds

Per replica a ring of ``slots`` time slots: a request is counted in the slot of the moment
it ended, and a report adds up the slots of the window (the current one, partly elapsed,
and those before it), so it covers the last ``window_s - slot`` to ``window_s`` seconds.
A slot holds three counts and three sparse latency histograms (``app.domain.traffic``, at
most ``BUCKET_COUNT`` buckets each), so memory is bounded by the replicas and the slots,
whatever the traffic. A replica with nothing left in its window is forgotten.

What counts, and how (docs/gateway.md#what-the-gateway-measures): the callers in
``app.gateway.proxy`` and ``app.gateway.exchange_steps`` say how each attempt at a replica
ended and pass the times they measured; this module only counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.domain.traffic import (
    Histogram,
    Outcome,
    ReplicaTraffic,
    add_sample,
    combined,
)

DEFAULT_WINDOW_S = 60.0
DEFAULT_SLOTS = 12
FORGET_ABOVE_REPLICAS = 1024
"""Replicas kept before a new one makes the window forget the idle ones (reports do that
anyway; this bounds a gateway whose reports are never read)."""


class _Slot:
    __slots__ = (
        "abandoned",
        "cancelled",
        "errors",
        "latency",
        "number",
        "requests",
        "tpot",
        "ttft",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.requests = 0
        self.errors = 0
        self.cancelled = 0
        self.abandoned = 0
        self.ttft: Histogram = {}
        self.tpot: Histogram = {}
        self.latency: Histogram = {}


class TrafficWindow:
    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        slots: int = DEFAULT_SLOTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or slots < 1:
            raise ValueError(f"a window of {window_s} s in {slots} slots")
        self.window_s = window_s
        self._slots = slots
        self._slot_s = window_s / slots
        self._clock = clock
        self._rings: dict[str, list[_Slot | None]] = {}

    def record(
        self,
        replica_id: str,
        outcome: Outcome,
        *,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        latency_s: float | None = None,
    ) -> None:
        """One attempt at ``replica_id`` ended so; the times are those that were measured."""
        number = int(self._clock() / self._slot_s)
        ring = self._rings.get(replica_id)
        if ring is None:
            if len(self._rings) >= FORGET_ABOVE_REPLICAS:
                self._forget_idle(number)
            ring = self._rings[replica_id] = [None] * self._slots
        position = number % self._slots
        slot = ring[position]
        if slot is None or slot.number != number:
            slot = ring[position] = _Slot(number)
        if outcome in (Outcome.CANCELLED, Outcome.ABANDONED):
            slot.cancelled += 1
            if outcome is Outcome.ABANDONED:
                slot.abandoned += 1
        else:
            slot.requests += 1
            if outcome is Outcome.FAILED:
                slot.errors += 1
        if ttft_s is not None:
            add_sample(slot.ttft, ttft_s * 1000)
        if tpot_s is not None:
            add_sample(slot.tpot, tpot_s * 1000)
        if latency_s is not None:
            add_sample(slot.latency, latency_s * 1000)

    def report(self) -> dict[str, ReplicaTraffic]:
        """What the window holds, per replica with anything in it."""
        number = int(self._clock() / self._slot_s)
        self._forget_idle(number)
        oldest = number - self._slots + 1
        report = {}
        for replica_id, ring in self._rings.items():
            fresh = (slot for slot in ring if slot is not None and slot.number >= oldest)
            report[replica_id] = combined(fresh) or ReplicaTraffic()
        return report

    def _forget_idle(self, number: int) -> None:
        oldest = number - self._slots + 1
        for replica_id, ring in list(self._rings.items()):
            if all(slot is None or slot.number < oldest for slot in ring):
                del self._rings[replica_id]
