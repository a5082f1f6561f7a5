"""The router: which serving replica takes a request, and what to do when none can.

Per replica it keeps the gateway's own counts (``in_flight``: requests open;
``reserved``: requests sent that the engine's metrics cannot show yet) and the latest
engine signals from a scraper task. ``acquire()`` picks a replica by the rule in
``app.gateway.admission`` and returns a ``Lease``; when none is eligible the request waits
in a bounded queue, fair across API keys, and is granted a lease as soon as a release, a
first byte or a scrape makes room, or gets ``Saturated`` after the queue timeout.

While a model is in a rollout's canary step (``GatewaySnapshot.canaries``), its replicas are
two sides: those of the canary revision and the others. Each request draws once from the
random source: below the canary's share it goes to the canary side, otherwise to the
others, and the replica within that side is chosen by the same rule as without a canary.
When the drawn side has no replica that can take the request now (none is routable, or
every one is saturated), the other side takes it; only when neither can does it wait. The
sides are split when a snapshot is taken: a request costs one look-up more, and one draw
in a canary step. Every gateway splits by the same rule on its own.

A reservation ends at the first byte of the answer, or earlier once a scrape that started
at least one full scrape after the request was sent has answered: by then the engine
counts the request itself (as waiting or running), and counting it twice would keep a
replica with long non-streaming requests saturated.

Exceptions: ``NoServingReplica`` (no route for the model: 503) and ``Saturated`` (every
replica at its limit: 429 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from collections.abc import Callable, Sequence

import aiohttp

from app.gateway.admission import (
    STALE_AFTER_INTERVALS,
    ReplicaState,
    ReplicaView,
    Signals,
    choose,
    is_fresh,
)
from app.gateway.fairqueue import FairQueue
from app.gateway.signals import EngineReading, ScraperTasks
from app.gateway.table import GatewaySnapshot, Route

__all__ = ["Lease", "NoServingReplica", "ReplicaView", "Router", "Saturated"]

RETIRED_LINGER_S = 30.0
"""How long a replica taken out of routing stays in ``in_flight()`` once it is idle."""


class NoServingReplica(Exception):
    def __init__(self, model: str) -> None:
        super().__init__(f"no serving replica for model {model!r}")
        self.model = model


class Saturated(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"every replica is saturated; retry after {retry_after_s:g} s")
        self.retry_after_s = retry_after_s


class Lease:
    """One request on one replica, from ``acquire()`` until ``release()``."""

    __slots__ = ("_open", "_replica", "_router", "queued_s", "route")

    def __init__(self, router: Router, replica: ReplicaState, queued_s: float) -> None:
        self.route: Route = replica.route
        self.queued_s = queued_s
        """Seconds the request waited in the queue for this lease (0 if none)."""
        self._router = router
        self._replica = replica
        self._open = True
        replica.in_flight += 1
        replica.reserve(self)

    def first_byte(self) -> None:
        """The replica answered: the reservation ends (idempotent)."""
        if self._replica.unreserve(self):
            self._router._capacity_freed(self._replica)

    def release(self) -> None:
        """The request is over, however it ended (idempotent)."""
        if not self._open:
            return
        self._open = False
        self._replica.unreserve(self)
        self._replica.in_flight -= 1
        self._router._capacity_freed(self._replica)


class _Waiter:
    __slots__ = ("enqueued_at", "exclude", "future", "key_id", "model")

    def __init__(
        self, model: str, key_id: str, exclude: frozenset[str], future: asyncio.Future[Lease]
    ) -> None:
        self.model = model
        self.key_id = key_id
        self.exclude = exclude
        self.future = future
        self.enqueued_at = 0.0


class _Split:
    """A model's replicas in a canary step: ``canary`` (those of the canary revision) take
    ``share`` of its requests, ``stable`` (the others) the rest."""

    __slots__ = ("canary", "share", "stable")

    def __init__(
        self, share: float, canary: list[ReplicaState], stable: list[ReplicaState]
    ) -> None:
        self.share = share
        self.canary = canary
        self.stable = stable


class Router:
    def __init__(
        self,
        *,
        queue_timeout_s: float = 5.0,
        queue_limit: int = 1000,
        scrape_interval_s: float = 0.25,
        scrape_timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        """``draw`` gives a number in [0, 1) for each request of a model in a canary step
        (a seeded ``random.Random(n).random`` in tests)."""
        self._queue_timeout_s = queue_timeout_s
        self._queue_limit = queue_limit
        self._scrapers = ScraperTasks(interval_s=scrape_interval_s, timeout_s=scrape_timeout_s)
        self._clock = clock
        self._draw = draw
        self._stale_after_s = STALE_AFTER_INTERVALS * scrape_interval_s
        self.retry_after_s = float(max(1, math.ceil(4 * scrape_interval_s)))
        """What ``Saturated`` tells clients: a few scrapes' time, at least a second."""
        self._replicas: dict[str, ReplicaState] = {}
        self._by_model: dict[str, list[ReplicaState]] = {}
        self._splits: dict[str, _Split] = {}
        self._retired: dict[str, ReplicaState] = {}
        self._queues: dict[str, FairQueue[_Waiter]] = {}
        self._queued = 0
        self._session: aiohttp.ClientSession | None = None

    # -- routing table ---------------------------------------------------------------------

    def update(self, snapshot: GatewaySnapshot) -> None:
        """Take the routes of a new snapshot; kept replicas keep their counts and signals."""
        fresh: dict[str, ReplicaState] = {}
        for routes in snapshot.routes.values():
            for route in routes:
                state = self._replicas.get(route.replica_id) or self._retired.pop(
                    route.replica_id, None
                )
                if state is None:
                    state = ReplicaState(route)
                elif state.route.url != route.url:
                    self._scrapers.stop(route.replica_id)
                    state.signals = None
                state.route = route
                state.retired_idle_since = None
                fresh[route.replica_id] = state
        for replica_id, state in self._replicas.items():
            if replica_id not in fresh:
                self._scrapers.stop(replica_id)
                self._retire(state)
        self._replicas = fresh
        self._forget_idle_retired()
        self._by_model = {}
        for state in fresh.values():
            self._by_model.setdefault(state.route.model, []).append(state)
            if self._session is not None and state.route.replica_id not in self._scrapers:
                self._start_scraper(state, self._session)
        self._splits = _splits(snapshot, self._by_model)
        for model in list(self._queues):
            self._fail_unroutable(model)
            self._dispatch(model)

    # -- admission -------------------------------------------------------------------------

    async def acquire(
        self, model: str, key_id: str, exclude: frozenset[str] = frozenset()
    ) -> Lease:
        if not self._has_candidates(model, exclude):
            raise NoServingReplica(model)
        queue = self._queues.get(model)
        if not queue:
            chosen = self._choose(model, exclude)
            if chosen is not None:
                return Lease(self, chosen, 0.0)
        if self._queued >= self._queue_limit or self._queue_timeout_s <= 0:
            raise Saturated(self.retry_after_s)
        waiter = _Waiter(model, key_id, exclude, asyncio.get_running_loop().create_future())
        waiter.enqueued_at = self._clock()
        self._queues.setdefault(model, FairQueue()).push(key_id, waiter)
        self._queued += 1
        self._dispatch(model)
        try:
            async with asyncio.timeout(self._queue_timeout_s):
                return await waiter.future
        except TimeoutError:
            self._abandon(waiter)
            raise Saturated(self.retry_after_s) from None
        except BaseException:
            self._abandon(waiter)
            raise

    def _has_candidates(self, model: str, exclude: frozenset[str]) -> bool:
        return any(s.route.replica_id not in exclude for s in self._by_model.get(model, ()))

    def _choose(self, model: str, exclude: frozenset[str]) -> ReplicaState | None:
        now = self._clock()
        split = self._splits.get(model)
        if split is None:
            return self._choose_among(self._by_model.get(model, ()), exclude, now)
        if self._draw() < split.share:
            drawn, other = split.canary, split.stable
        else:
            drawn, other = split.stable, split.canary
        chosen = self._choose_among(drawn, exclude, now)
        return chosen if chosen is not None else self._choose_among(other, exclude, now)

    def _choose_among(
        self, replicas: Sequence[ReplicaState], exclude: frozenset[str], now: float
    ) -> ReplicaState | None:
        if exclude:
            replicas = [s for s in replicas if s.route.replica_id not in exclude]
        return choose(replicas, now=now, stale_after_s=self._stale_after_s)

    def _dispatch(self, model: str) -> None:
        """Grant leases to waiters of ``model``, in fair order, while replicas have room."""
        queue = self._queues.get(model)
        while queue:
            memo: dict[frozenset[str], ReplicaState | None] = {}
            granted = queue.pop_first(functools.partial(self._choose_for_waiter, model, memo))
            if granted is None:
                break
            waiter, state = granted
            self._queued -= 1
            if waiter.future.done():
                continue  # cancelled; its task has not run yet to take it out
            waiter.future.set_result(Lease(self, state, self._clock() - waiter.enqueued_at))
        if queue is not None and not queue:
            del self._queues[model]

    def _choose_for_waiter(
        self, model: str, memo: dict[frozenset[str], ReplicaState | None], waiter: _Waiter
    ) -> ReplicaState | None:
        # Most waiters share the same (empty) exclusion: choose once for all of them.
        if waiter.exclude not in memo:
            memo[waiter.exclude] = self._choose(model, waiter.exclude)
        return memo[waiter.exclude]

    def _abandon(self, waiter: _Waiter) -> None:
        """The waiter gave up (its task was cancelled, which also cancels its future): take
        it out of the queue, or hand back a lease granted just before."""
        queue = self._queues.get(waiter.model)
        if queue is not None and queue.remove(waiter.key_id, waiter):
            self._queued -= 1
            if not queue:
                del self._queues[waiter.model]
        future = waiter.future
        if not future.done():
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            future.result().release()

    def _fail_unroutable(self, model: str) -> None:
        queue = self._queues.get(model)
        if queue is None:
            return
        for waiter in [w for w in queue if not self._has_candidates(model, w.exclude)]:
            queue.remove(waiter.key_id, waiter)
            self._queued -= 1
            if not waiter.future.done():
                waiter.future.set_exception(NoServingReplica(model))
        if not queue:
            del self._queues[model]

    def _capacity_freed(self, state: ReplicaState) -> None:
        if self._retired.get(state.route.replica_id) is state:
            if state.in_flight == 0 and state.retired_idle_since is None:
                state.retired_idle_since = self._clock()
            return
        if self._queues:
            self._dispatch(state.route.model)

    def _forget_idle_retired(self) -> None:
        now = self._clock()
        for replica_id, state in list(self._retired.items()):
            idle_since = state.retired_idle_since
            if idle_since is not None and now - idle_since > RETIRED_LINGER_S:
                del self._retired[replica_id]

    def _retire(self, state: ReplicaState) -> None:
        state.signals = None
        state.retired_idle_since = self._clock() if state.in_flight == 0 else None
        self._retired[state.route.replica_id] = state

    # -- scrapers --------------------------------------------------------------------------

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        for state in self._replicas.values():
            if state.route.replica_id not in self._scrapers:
                self._start_scraper(state, session)

    async def close(self) -> None:
        self._session = None
        await self._scrapers.close()
        for model, queue in list(self._queues.items()):
            while queue:
                future = queue.pop().future
                if not future.done():
                    future.set_exception(Saturated(self.retry_after_s))
            del self._queues[model]
        self._queued = 0

    def _start_scraper(self, state: ReplicaState, session: aiohttp.ClientSession) -> None:
        def report(sequence: int, reading: EngineReading | None) -> None:
            if self._replicas.get(state.route.replica_id) is not state:
                return
            if reading is not None:
                state.signals = Signals(
                    waiting=reading.waiting,
                    running=reading.running,
                    kv_usage=reading.kv_usage,
                    scraped_at=self._clock(),
                )
                state.absorb_reservations(sequence)
            if self._queues:
                self._dispatch(state.route.model)

        replica_id = state.route.replica_id
        self._scrapers.start(replica_id, state.route.url, session, state.begin_scrape, report)

    # -- what the gateway publishes --------------------------------------------------------

    def in_flight(self) -> dict[str, int]:
        """Requests open per replica, also for replicas recently taken out of routing."""
        self._forget_idle_retired()
        counts = {rid: s.in_flight for rid, s in self._retired.items()}
        counts.update((rid, s.in_flight) for rid, s in self._replicas.items())
        return counts

    def replica_views(self) -> list[ReplicaView]:
        now = self._clock()
        return [s.view(now, self._stale_after_s) for s in self._replicas.values()]

    def stale_replicas(self) -> int:
        now = self._clock()
        return sum(
            not is_fresh(s.signals, now=now, stale_after_s=self._stale_after_s)
            for s in self._replicas.values()
        )

    def queued(self) -> dict[str, int]:
        """Requests waiting for a replica, per model."""
        return {model: len(queue) for model, queue in self._queues.items()}


def _splits(
    snapshot: GatewaySnapshot, by_model: dict[str, list[ReplicaState]]
) -> dict[str, _Split]:
    """The canary split of each model in a canary step whose replicas are on both sides: with
    one side empty every request ends on the other anyway, as without a split."""
    splits: dict[str, _Split] = {}
    for model, canary in snapshot.canaries.items():
        replicas = by_model.get(model, [])
        on_canary = [s for s in replicas if s.route.revision == canary.revision]
        others = [s for s in replicas if s.route.revision != canary.revision]
        if on_canary and others:
            splits[model] = _Split(canary.share, on_canary, others)
    return splits
