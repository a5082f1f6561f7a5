"""The router: which serving replica takes a request, and what to do when none can.

``acquire()`` asks ``app.gateway.replica_choice`` for a replica of the model (by its
routing policy and canary step, among those of the last routing table that this gateway
has not ejected) and returns a ``Lease`` on it (``app.gateway.lease``); when none can take
the request it waits in a bounded line, fair across API keys (``app.gateway.waiting_line``),
and is granted a lease as soon as a release, a first byte or a scrape makes room, or gets
``Saturated`` after the queue timeout. The replicas themselves, their counts and engine
signals and the scrapers that read them, are ``app.gateway.replica_book``'s.

A model with an autoscaling policy (``GatewaySnapshot.cold_start_s``) that has no route at
all is starting from zero, or about to: a request for it is held in the model's queue (the
same fair, bounded queue) for up to the model's cold-start timeout instead of failing at
once, and is granted a lease as soon as a routing table with a replica of the model
arrives. Waiters that were queued for a saturated replica when their model lost its last
route are held likewise, for a cold-start timeout from then. A timeout lowered by a
table shortens the holds under way to it (from when each began); a raised one does not
lengthen them.

A model without a route that the snapshot shows failing to start (``start_failures``: in
failure backoff, no replica of it starting) will not be served before its backoff ends: a
request for it is answered at once with ``FailingToStart`` (``Retry-After`` the time
until the next attempt; why it fails is the operators' to read, not the clients'),
whether it has an autoscaling policy or not, and the requests held or waiting for it when
a table shows the failure are answered so too. Once the backoff's end has passed, the
next replica is under way and requests are held again. A model without a policy that its
operator scaled to zero is refused with ``NoServingReplica`` marked ``scaled_to_zero``:
none comes back until an operator acts. Any other model without a route whose replicas the
snapshot shows placed or starting (``starting``: just declared or scaled up, or every
replica being replaced) is refused with ``NoServingReplica`` carrying how many: it is
loading, not failing, and one may serve within seconds.

The router calls its ``on_hold`` listener when it starts holding requests
for a model that held none, so the gateway reports the demand at once
(``app.gateway.source``); ``queued()`` counts held requests with the others.

Each choice's reason (``RouteReason``) is counted per model and policy, and carried by its
lease; the proxy tells each lease how its attempt went, and replicas that keep failing are
passed over by this gateway for a while (``app.gateway.ejection``).

The router refuses a request with one of ``app.gateway.route_refusals``. A request waiting
for a replica (``app.gateway.waiter``) and the pools and canary splits a replica is chosen
from (``app.gateway.replica_pools``) have a module each.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence

import aiohttp

from app.domain.rendezvous import Rendezvous
from app.gateway.admission import ReplicaState, ReplicaView
from app.gateway.affinity import RouteKey
from app.gateway.ejection import EjectionPolicy, Ejector
from app.gateway.lease import Lease
from app.gateway.replica_book import ReplicaBook
from app.gateway.replica_choice import ReplicaChooser
from app.gateway.replica_pools import Choice, RouteReason
from app.gateway.route_refusals import (
    ColdStartTimedOut,
    FailingToStart,
    GatewayStopping,
    ModelRemoved,
    NoServingReplica,
    Saturated,
    backoff_retry_after_s,
    cold_start_retry_after_s,
)
from app.gateway.table import GatewaySnapshot, RoutePolicy, StartFailure
from app.gateway.waiter import HoldOutcome, Waiter
from app.gateway.waiting_line import WaitingLine


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
        ejection: EjectionPolicy | None = None,
    ) -> None:
        """``draw`` gives a number in [0, 1) for each request of a model in a canary step
        (a seeded ``random.Random(n).random`` in tests). ``ejection``: when replicas that
        keep failing are taken out of rotation (``app.gateway.ejection``)."""
        self._queue_timeout_s = queue_timeout_s
        self._clock = clock
        self.replicas = ReplicaBook(
            scrape_interval_s=scrape_interval_s,
            scrape_timeout_s=scrape_timeout_s,
            clock=clock,
            on_report=self._scraped,
        )
        """Every replica's counts and engine signals (``app.gateway.replica_book``)."""
        self.retry_after_s = float(max(1, math.ceil(4 * scrape_interval_s)))
        """What ``Saturated`` tells clients: a few scrapes' time, at least a second."""
        self.ejector = Ejector(ejection, clock)
        self._chooser = ReplicaChooser(
            clock=clock, draw=draw, ejector=self.ejector, stale_after_s=self.replicas.stale_after_s
        )
        self._ids: dict[str, tuple[list[ReplicaState], tuple[str, ...]]] = {}
        """Each model's routed replicas as last given to the ejector, and their ids."""
        self._decisions: Counter[tuple[str, str, RouteReason]] = Counter()
        self._line = WaitingLine(queue_limit)
        self._cold_start_s: dict[str, float] = {}
        self._start_failures: dict[str, StartFailure] = {}
        self._scaled_to_zero: frozenset[str] = frozenset()
        self._starting: dict[str, int] = {}
        self._declared: frozenset[str] = frozenset()
        self._holds: Counter[tuple[str, HoldOutcome]] = Counter()
        self._on_hold: Callable[[], None] | None = None
        self._held_models: set[str] = set()
        """Models whose waiters are held for a cold start: each went to zero (or had
        requests held from zero) since it last had a route."""
        self._stopping = False

    def on_hold(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the router's loop) whenever a request for a model starting
        from zero is held and none was held for it before, and whenever a model with
        requests waiting loses its last route."""
        self._on_hold = listener

    # -- routing table ---------------------------------------------------------------------

    def update(self, snapshot: GatewaySnapshot) -> None:
        """Take the routes of a new snapshot; kept replicas keep their counts and signals.
        A model whose routes are the tuple taken before keeps its replicas, their tracking
        and its pools (unless its policy or canary step changed): a snapshot costs the
        models that changed, not the fleet."""
        self.replicas.take(snapshot)
        by_model = self.replicas.by_model
        self.ejector.track(self._replica_ids(by_model))
        self._chooser.take(snapshot, by_model)
        self._cold_start_s = dict(snapshot.cold_start_s)
        self._start_failures = dict(snapshot.start_failures)
        self._scaled_to_zero = snapshot.scaled_to_zero
        self._starting = dict(snapshot.starting)
        self._held_models = {
            m for m in self._held_models if m not in by_model and m in self._cold_start_s
        }
        for model in self._line.models():
            if (hold_s := self._cold_start_s.get(model)) is not None:
                for waiter in self._line.waiters(model):
                    waiter.shorten_hold(hold_s)
        removed = self._declared - snapshot.declared
        self._declared = snapshot.declared
        for model in self._line.models():
            self._fail_unroutable(model, removed=model in removed)
            self._dispatch(model)
        if removed:
            # Counted for /metrics by model: a removed model's series go with it.
            self._decisions = Counter(
                {d: n for d, n in self._decisions.items() if d[0] not in removed}
            )
            self._holds = Counter({h: n for h, n in self._holds.items() if h[0] not in removed})

    def _replica_ids(self, by_model: dict[str, list[ReplicaState]]) -> dict[str, tuple[str, ...]]:
        """The ids of each model's routed replicas: the tuple of the last time for a model
        whose list of replicas is the same object (so the ejector passes it over)."""
        before = self._ids
        ids: dict[str, tuple[list[ReplicaState], tuple[str, ...]]] = {}
        for model, states in by_model.items():
            kept = before.get(model)
            if kept is None or kept[0] is not states:
                kept = (states, tuple(s.route.replica_id for s in states))
            ids[model] = kept
        self._ids = ids
        return {model: kept[1] for model, kept in ids.items()}

    def policy_of(self, model: str) -> RoutePolicy:
        return self._chooser.policy_of(model)

    def rendezvous_of(self, model: str) -> Rendezvous | None:
        """The rendezvous ``model``'s keyed requests are hashed on
        (``ReplicaChooser.rendezvous_of``): its walk of a key names the replica the key's
        requests go to first, and those they move on to."""
        return self._chooser.rendezvous_of(model)

    # -- admission -------------------------------------------------------------------------

    async def acquire(
        self,
        model: str,
        key_id: str,
        exclude: frozenset[str] = frozenset(),
        route_key: RouteKey | None = None,
    ) -> Lease:
        """A lease on a replica of ``model`` (none of ``exclude``); ``route_key``: the
        request's key under its model's policy (``app.gateway.affinity``), if it has one."""
        if (failing := self._failing_to_start(model)) is not None:
            raise failing
        hold_s = self._hold_s(model)
        if hold_s is None and not self._has_candidates(model, exclude):
            raise self._no_serving_replica(model)
        if hold_s is not None and self._stopping:
            raise GatewayStopping(model)
        # ``size`` first: no call at all while no request waits.
        if hold_s is None and not (self._line.size and self._line.waits_for(model)):
            chosen = self._chooser.choose(model, exclude, route_key)
            if chosen is not None:
                return self._lease(model, chosen, 0.0)
        if self._line.full() and not self._make_room_for(key_id):
            raise Saturated(self.retry_after_s, starting=hold_s is not None)
        if hold_s is None and self._queue_timeout_s <= 0:
            raise Saturated(self.retry_after_s)
        first = not self._line.waits_for(model)  # room made may have emptied its line
        waiter = Waiter(
            model, key_id, exclude, asyncio.get_running_loop().create_future(), route_key
        )
        waiter.enqueued_at = self._clock()
        waiter.hold_s = hold_s
        self._line.push(waiter)
        if hold_s is None:
            self._dispatch(model)
        else:
            self._held_from_now(model, (), wake=first)
        try:
            timeout_s = self._queue_timeout_s if hold_s is None else hold_s
            async with asyncio.timeout(timeout_s) as deadline:
                waiter.deadline = deadline
                lease = await waiter.future
        except TimeoutError:
            self._abandon(waiter)
            if waiter.hold_s is None:
                raise Saturated(self.retry_after_s) from None
            self._count_hold(model, "timed_out")
            if model in self.replicas.by_model:  # a replica came, but had no room in time
                raise Saturated(self.retry_after_s) from None
            retry_after_s = max(self.retry_after_s, cold_start_retry_after_s(waiter.hold_s))
            raise ColdStartTimedOut(model, waiter.hold_s, retry_after_s) from None
        except BaseException as exc:
            self._abandon(waiter)
            if waiter.hold_s is not None:
                ended: HoldOutcome = (
                    "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
                )
                self._count_hold(model, ended)
            raise
        if waiter.hold_s is not None:
            self._count_hold(model, "served")
        return lease

    def _count_hold(self, model: str, ended: HoldOutcome) -> None:
        """Count a hold of ``model`` that ended, for /metrics: not once the model is removed
        (its series went with it)."""
        if model in self._declared:
            self._holds[model, ended] += 1

    def _hold_s(self, model: str) -> float | None:
        """How long a request for ``model`` is held: its cold-start timeout while it has no
        route at all; ``None`` when it has a route, or no autoscaling policy."""
        if model in self.replicas.by_model:
            return None
        return self._cold_start_s.get(model)

    def _failing_to_start(self, model: str) -> FailingToStart | None:
        """The refusal for ``model`` when it has no route and its failure backoff is not
        over: no replica serves it before then."""
        failure = self._start_failures.get(model)
        if failure is None or model in self.replicas.by_model or model in self._scaled_to_zero:
            return None  # scaled to zero by its operator: no attempt comes after the backoff
        now = self._clock()
        if failure.retry_at <= now:
            return None  # the next replica is being placed: hold as for any cold start
        retry_after_s = backoff_retry_after_s(failure.retry_at, now)
        return FailingToStart(model, failure.failures, retry_after_s)

    def _no_serving_replica(self, model: str) -> NoServingReplica:
        """The refusal for ``model`` when no replica can take a request: it says why when
        the model has no route at all, because its operator scaled it to zero or because
        its replicas are still starting."""
        if model in self.replicas.by_model:
            return NoServingReplica(model)  # its routes were all excluded: tried already
        if model in self._scaled_to_zero:
            return NoServingReplica(model, scaled_to_zero=True)
        return NoServingReplica(model, starting=self._starting.get(model, 0))

    def _has_candidates(self, model: str, exclude: frozenset[str]) -> bool:
        return any(s.route.replica_id not in exclude for s in self.replicas.by_model.get(model, ()))

    def _lease(
        self, model: str, chosen: tuple[ReplicaState, RouteReason], queued_s: float
    ) -> Lease:
        state, reason = chosen
        policy = self._chooser.policy_of(model).policy
        self._decisions[model, policy, reason] += 1
        return Lease(self, self.ejector, state, queued_s, policy, reason)

    def _dispatch(self, model: str) -> None:
        """Grant leases to waiters of ``model``, in fair order, while replicas have room."""
        while self._line.waits_for(model):
            memo: dict[tuple[frozenset[str], RouteKey | None], Choice] = {}
            granted = self._line.pop_grantable(
                model, functools.partial(self._choose_for_waiter, model, memo)
            )
            if granted is None:
                break
            waiter, chosen = granted
            if waiter.future.done():
                continue  # cancelled; its task has not run yet to take it out
            waiter.future.set_result(self._lease(model, chosen, self._clock() - waiter.enqueued_at))

    def _make_room_for(self, key_id: str) -> bool:
        """The queue is full: a waiter of the key with the most gives its place up to
        ``key_id`` when that is fair (``WaitingLine.make_room_for``), and is answered 429,
        as a full queue answers. Whether room was made."""
        victim = self._line.make_room_for(key_id)
        if victim is None:
            return False
        if not victim.future.done():
            victim.future.set_exception(
                Saturated(self.retry_after_s, starting=victim.hold_s is not None)
            )
        return True

    def _choose_for_waiter(
        self,
        model: str,
        memo: dict[tuple[frozenset[str], RouteKey | None], Choice],
        waiter: Waiter,
    ) -> Choice:
        # Most waiters share the same (empty) exclusion: choose once for all of them (and
        # once per key, where the policy hashes one).
        asked = (waiter.exclude, waiter.route_key)
        if asked not in memo:
            memo[asked] = self._chooser.choose(model, waiter.exclude, waiter.route_key)
        return memo[asked]

    def _abandon(self, waiter: Waiter) -> None:
        """The waiter gave up (its task was cancelled, which also cancels its future): take
        it out of the queue, or hand back a lease granted just before."""
        self._line.remove(waiter)
        future = waiter.future
        if not future.done():
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            future.result().release()

    def _fail_unroutable(self, model: str, *, removed: bool = False) -> None:
        """Fail the waiters of ``model`` that no replica can take (all of them, when it is
        failing to start); unless the model is starting from zero: then its waiters are held
        for the cold start. ``removed``: the table that took the model's routes away no
        longer declares it."""
        if not self._line.waits_for(model):
            return
        if not removed and (failing := self._failing_to_start(model)) is not None:
            for waiter in self._line.take_out(model, lambda waiter: True):
                if not waiter.future.done():
                    waiter.future.set_exception(failing)
            return
        if self._hold_s(model) is not None:
            if model not in self._held_models:  # it lost its last route since
                self._held_from_now(model, list(self._line.waiters(model)))
            return
        unroutable = self._line.take_out(
            model, lambda waiter: not self._has_candidates(model, waiter.exclude)
        )
        for waiter in unroutable:
            if not waiter.future.done():
                refusal = ModelRemoved(model) if removed else self._no_serving_replica(model)
                waiter.future.set_exception(refusal)

    def _held_from_now(self, model: str, waiters: Sequence[Waiter], *, wake: bool = False) -> None:
        """``model`` has no route: hold ``waiters`` for a cold start from now on, and wake
        the report writer (so the leader hears of the demand at once) when asked, and the
        first time since the model last had a route."""
        hold_s = self._cold_start_s[model]
        for waiter in waiters:
            waiter.hold(hold_s)
        if model not in self._held_models:
            self._held_models.add(model)
            wake = True
        if wake and self._on_hold is not None:
            self._on_hold()

    def turn_away_held(self) -> int:
        """The gateway stops: answer every request held for a cold start now (its client may
        try another gateway), and hold no more. Requests waiting for room stay: a replica
        frees one within the queue timeout. Returns how many were turned away."""
        self._stopping = True
        turned_away = 0
        for model in self._line.models():
            for waiter in self._line.take_out(model, lambda waiter: waiter.hold_s is not None):
                turned_away += 1
                if not waiter.future.done():
                    waiter.future.set_exception(GatewayStopping(model))
        return turned_away

    def capacity_freed(self, state: ReplicaState) -> None:
        """A lease's replica has room again (``CapacityReturn``, told by ``Lease``): the
        next waiter for its model is dispatched (``ReplicaBook.freed`` keeps the account of
        a retired one)."""
        if self.replicas.freed(state) and self._line.size:
            self._dispatch(state.route.model)

    def _scraped(self, model: str) -> None:
        """A scrape of a replica of ``model`` answered: its room may have grown."""
        if self._line.size:
            self._dispatch(model)

    # -- scrapers --------------------------------------------------------------------------

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.replicas.start(session)

    async def close(self) -> None:
        await self.replicas.close()
        for waiter in self._line.take_all():
            if not waiter.future.done():
                waiter.future.set_exception(Saturated(self.retry_after_s))

    # -- what the gateway publishes --------------------------------------------------------

    def in_flight(self) -> dict[str, int]:
        """Requests open per replica, also for replicas recently taken out of routing."""
        return self.replicas.in_flight()

    def replica_views(self) -> list[ReplicaView]:
        return self.replicas.views()

    def stale_replicas(self) -> int:
        return self.replicas.stale()

    def queued(self) -> dict[str, int]:
        """Requests waiting for a replica, per model (those held for a cold start too)."""
        return self._line.counts()

    def route_decisions(self) -> dict[tuple[str, str, str], int]:
        """Requests given a replica, by model, routing policy and reason (``RouteReason``)."""
        return {decision: count for decision, count in self._decisions.items()}

    def cold_start_holds(self) -> dict[tuple[str, str], int]:
        """Requests held for a cold start that ended, by model and how they ended
        (``HoldOutcome``)."""
        return {ended: count for ended, count in self._holds.items()}
