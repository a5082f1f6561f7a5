"""Which replica takes the next request: eligibility and choice, without I/O or a clock.

A replica with *fresh* engine signals is eligible iff

    waiting + reserved < target_waiting   and   kv_usage < kv_ceiling

where ``reserved`` counts the gateway's own requests the engine cannot have reported yet.
Among eligible replicas the lowest ``max((waiting + reserved) / target_waiting,
kv_usage / kv_ceiling) / weight`` wins, ties broken by ``in_flight / weight``. A signal
the engine does not export reads 0 (``app.gateway.signals``): an engine without a
KV-cache gauge, llama.cpp's server, is admitted by its waiting queue alone.

A replica whose signals are *stale* (none yet, or older than ``stale_after_s``) is judged
by the gateway's own in-flight count alone: eligible iff ``in_flight < 2 * target_waiting``,
with load ``in_flight / (2 * target_waiting)``. That count falls every time one of
the gateway's own requests ends, so a stale replica is never saturated for ever.

Draining replicas are chosen only when no other replica is eligible.

A model whose routing sets ``max_in_flight`` bounds each replica by this gateway's own
in-flight count as well, whatever its signals say: a request that finds every replica at
the bound waits in the gateway's queue instead of in one engine's, and goes to the first
replica with room, a replica that has just started serving among them (late binding: an
engine's queue is bound to one replica, the gateway's to none). The count is exact for
this gateway and knows nothing of the others, so the bound is per gateway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

import msgspec

from app.domain.tuning import MAX_BENCH_CAPACITY
from app.gateway.table import Route

STALE_AFTER_INTERVALS = 3
"""Signals older than this many scrape intervals are stale, or than one interval and the
scrape timeout where that is longer (``app.gateway.replica_book``)."""
STALE_IN_FLIGHT_FACTOR = 2
"""A stale replica takes up to ``factor * target_waiting`` requests from this gateway."""
_MIN_WEIGHT = 1e-6
MAX_RUNNING = MAX_BENCH_CAPACITY
"""The most requests one replica can be running: the most a bench may say a replica serves
(``app.domain.tuning``), far above any engine's batch (vLLM runs at most 256 at once by
default, its ``--max-num-seqs``). An engine's larger running count is unusable for its
model's total (``counted``)."""


class Signals(msgspec.Struct, frozen=True, kw_only=True):
    """What one scrape of an engine's ``/metrics`` said."""

    waiting: float
    running: float
    kv_usage: float
    """Fraction of the KV cache in use, 0..1."""
    scraped_at: float
    """The gateway's monotonic clock when the scrape answered."""
    absent: tuple[str, ...] = ()
    """The signals the engine exports no name for (``waiting``, ``running``,
    ``kv_usage``): they read 0 here, and are left out of the gateway's ``/metrics``."""


class Load(Protocol):
    """One replica as admission sees it at one instant."""

    @property
    def route(self) -> Route: ...
    @property
    def signals(self) -> Signals | None: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def reserved(self) -> int: ...


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A ``Load`` frozen in time."""

    route: Route
    signals: Signals | None
    in_flight: int
    reserved: int


Rank = tuple[bool, float, float]
"""(draining, load / weight, in_flight / weight): lower is better."""

L = TypeVar("L", bound=Load)


def is_fresh(signals: Signals | None, *, now: float, stale_after_s: float) -> bool:
    return signals is not None and now - signals.scraped_at <= stale_after_s


def assess(
    candidate: Load, *, now: float, stale_after_s: float, max_in_flight: int | None = None
) -> Rank | None:
    """The candidate's rank, or ``None`` when it may not take a request now."""
    route, signals = candidate.route, candidate.signals
    if max_in_flight is not None and candidate.in_flight >= max_in_flight:
        return None
    # A target below 1 would make the replica refuse everything for ever.
    target = route.target_waiting if route.target_waiting >= 1 else 1
    if signals is None or now - signals.scraped_at > stale_after_s:
        limit = STALE_IN_FLIGHT_FACTOR * target
        if candidate.in_flight >= limit:
            return None
        load = candidate.in_flight / limit
    else:
        waiting = signals.waiting + candidate.reserved
        if waiting >= target or signals.kv_usage >= route.kv_ceiling:
            return None
        kv = signals.kv_usage / route.kv_ceiling if route.kv_ceiling > 0 else 0.0
        load = max(waiting / target, kv)
    weight = route.weight if route.weight > _MIN_WEIGHT else _MIN_WEIGHT
    return (route.draining, load / weight, candidate.in_flight / weight)


def carried(candidate: Load, *, now: float, stale_after_s: float) -> float:
    """The requests the replica carries as admission counts them: with fresh signals, the
    engine's running and waiting ones plus the gateway's reservations (every gateway sees
    the same engine, so their counts agree); with stale ones, the gateway's in-flight."""
    signals = candidate.signals
    if signals is None or now - signals.scraped_at > stale_after_s:
        return float(candidate.in_flight)
    return signals.running + signals.waiting + candidate.reserved


def counted(candidate: Load, *, now: float, stale_after_s: float) -> float:
    """What the replica adds to its model's total load for the bounded loads of keyed
    routing (``app.domain.rendezvous``): ``carried``, its waiting ones (with the gateway's
    reservations) no more than its ``target_waiting``, past which admission refuses it
    anyway, and its running ones not at all when they are more than ``MAX_RUNNING``, which
    no replica can be running. An engine is no trusted source: one saying it holds a billion
    waiting or running requests would otherwise raise every other replica's bound, and keys
    would stay on full homes. Its own load (``carried``) still says it is full: the lie costs
    the liar alone."""
    signals = candidate.signals
    if signals is None or now - signals.scraped_at > stale_after_s:
        return float(candidate.in_flight)
    waiting = signals.waiting + candidate.reserved
    target = candidate.route.target_waiting  # below 1 it is 1, as for admission
    if waiting > target and waiting > 1.0:  # per member of every keyed request: no min()
        waiting = float(target) if target >= 1 else 1.0
    running = signals.running
    if running > MAX_RUNNING:
        return waiting  # unusable, as a sample that cannot be read is skipped
    return running + waiting


def is_eligible(
    candidate: Load, *, now: float, stale_after_s: float, max_in_flight: int | None = None
) -> bool:
    return (
        assess(candidate, now=now, stale_after_s=stale_after_s, max_in_flight=max_in_flight)
        is not None
    )


def choose(
    candidates: Iterable[L],
    *,
    now: float,
    stale_after_s: float,
    max_in_flight: int | None = None,
) -> L | None:
    """The eligible candidate to send the next request to, or ``None`` if none is."""
    best: L | None = None
    best_rank: Rank | None = None
    for candidate in candidates:
        candidate_rank = assess(
            candidate, now=now, stale_after_s=stale_after_s, max_in_flight=max_in_flight
        )
        if candidate_rank is not None and (best_rank is None or candidate_rank < best_rank):
            best, best_rank = candidate, candidate_rank
    return best


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """One replica as the gateway's metrics publish it."""

    replica_id: str
    model: str
    url: str
    weight: float
    draining: bool
    in_flight: int
    reserved: int
    waiting: float | None
    running: float | None
    kv_usage: float | None
    signals_age_s: float | None
    """Seconds since the last good scrape; ``None`` before the first."""
    stale: bool


class ReplicaState:
    """The gateway's running account of one replica (mutable; owned by the router)."""

    __slots__ = (
        "_reservations",
        "in_flight",
        "retired_idle_since",
        "route",
        "scrapes_begun",
        "signals",
    )

    def __init__(self, route: Route) -> None:
        self.route = route
        self.in_flight = 0
        self.signals: Signals | None = None
        self.scrapes_begun = 0
        self.retired_idle_since: float | None = None
        """Out of routing and idle since then; ``None`` while routed or busy."""
        # Reservation holder -> scrapes begun when it was made.
        self._reservations: dict[object, int] = {}

    @property
    def reserved(self) -> int:
        return len(self._reservations)

    def reserve(self, holder: object) -> None:
        self._reservations[holder] = self.scrapes_begun

    def unreserve(self, holder: object) -> bool:
        return self._reservations.pop(holder, None) is not None

    def begin_scrape(self) -> int:
        self.scrapes_begun += 1
        return self.scrapes_begun

    def absorb_reservations(self, scrape: int) -> None:
        """Scrape number ``scrape`` answered: drop the reservations it must already count.

        Scrape ``n + 1`` may have been sent before a request reserved at ``n`` left the
        gateway; scrape ``n + 2`` began a whole interval later, so the engine had it by then.
        """
        absorbed = [h for h, begun in self._reservations.items() if begun + 2 <= scrape]
        for holder in absorbed:
            del self._reservations[holder]

    def view(self, now: float, stale_after_s: float) -> ReplicaView:
        signals, route = self.signals, self.route
        return ReplicaView(
            replica_id=route.replica_id,
            model=route.model,
            url=route.url,
            weight=route.weight,
            draining=route.draining,
            in_flight=self.in_flight,
            reserved=self.reserved,
            waiting=_exported(signals, "waiting"),
            running=_exported(signals, "running"),
            kv_usage=_exported(signals, "kv_usage"),
            signals_age_s=None if signals is None else now - signals.scraped_at,
            stale=not is_fresh(signals, now=now, stale_after_s=stale_after_s),
        )


def _exported(signals: Signals | None, name: str) -> float | None:
    """The engine's figure for signal ``name``; None before its first reading, or when its
    engine exports none (llama.cpp's KV-cache usage): a 0 would say the cache is empty."""
    if signals is None or name in signals.absent:
        return None
    value: float = getattr(signals, name)
    return value
