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
A request with a key (``prefix``, ``session``) draws from its key instead
(``rendezvous.key_fraction``): its turns stay on one side, the same in every gateway. When
the drawn side has no replica that can take the request now (none is routable, or
every one is saturated), the other side takes it; only when neither can does it wait. The
sides are split when a snapshot is taken: a request costs one look-up more, and one draw
in a canary step. Every gateway splits by the same rule on its own.

A model with an autoscaling policy (``GatewaySnapshot.cold_start_s``) that has no route at
all is starting from zero, or about to: a request for it is held in the model's queue (the
same fair, bounded queue) for up to the model's cold-start timeout instead of failing at
once, and is granted a lease as soon as a routing table with a replica of the model
arrives. Waiters that were queued for a saturated replica when their model lost its last
route are held likewise, for a cold-start timeout from then. A timeout lowered by a
table shortens the holds under way to it (from when each began); a raised one does not
lengthen them. The router calls its ``on_hold`` listener when it starts holding requests
for a model that held none, so the gateway reports the demand at once
(``app.gateway.source``); ``queued()`` counts held requests with the others.

Which eligible replica takes a request is the model's routing policy
(``GatewaySnapshot.policies``, ``docs/gateway-routing.md``): ``least_loaded`` is the rule
of ``app.gateway.admission``; ``prefix`` and ``session`` hash the request's key
(``app.gateway.affinity``) onto the model's replicas by weighted rendezvous hashing
(``app.domain.rendezvous``) with bounded loads, the load being the requests a replica
carries as admission counts them (``admission.carried``: the engine's running and waiting
ones and this gateway's reservations, much the same for every gateway; its own in-flight
while signals are stale); each replica adds to the total the bounds are shared from no more
waiting ones than its ``target_waiting``, and no running ones past ``MAX_RUNNING``
(``admission.counted``), so that an engine saying it holds a billion cannot raise every
other replica's bound. A replica the admission rule
refuses, or one above its bound, is passed over for the next on the key's walk. Replicas
left out (ejected, or excluded by a retry) are passed over too, and the bound is shared
among the others (``Rendezvous.pick``'s ``absent``). Draining replicas are on no walk
while others serve: their keys move on, and they are chosen only when no other replica can
take the request.
Each pool's ``Rendezvous`` is built when a snapshot is taken, and only when the model's
replicas or weights changed; a request costs a draw per replica (one multiplication makes
them all) and, when its home cannot take it, one sort. Each choice's reason
(``RouteReason``) is counted per model and policy, and carried by its lease.

A reservation ends at the first byte of the answer, or earlier once a scrape that started
at least one full scrape after the request was sent has answered: by then the engine
counts the request itself (as waiting or running), and counting it twice would keep a
replica with long non-streaming requests saturated.

Replicas that keep failing are passed over by this gateway for a while
(``app.gateway.ejection``): the proxy tells each lease how its attempt went, and
``_choose`` leaves the ejected replicas out, as it leaves out those a retry excludes.

The router refuses a request with one of ``app.gateway.route_refusals``. A request's lease
(``app.gateway.lease``), a request waiting for a replica (``app.gateway.waiter``) and the
pools and canary splits a replica is chosen from (``app.gateway.replica_pools``) have a
module each.
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

from app.domain.rendezvous import Rendezvous, key_fraction
from app.gateway.admission import (
    STALE_AFTER_INTERVALS,
    ReplicaState,
    ReplicaView,
    Signals,
    assess,
    carried,
    choose,
    counted,
    is_fresh,
)
from app.gateway.affinity import RouteKey
from app.gateway.ejection import EjectionPolicy, Ejector
from app.gateway.fairqueue import FairQueue
from app.gateway.lease import Lease
from app.gateway.replica_pools import (
    KEYED_REASONS,
    CanarySplit,
    Choice,
    Pool,
    RouteReason,
    canary_splits,
)
from app.gateway.route_refusals import (
    ColdStartTimedOut,
    GatewayStopping,
    ModelRemoved,
    NoServingReplica,
    Saturated,
    cold_start_retry_after_s,
)
from app.gateway.signals import EngineReading, ScraperTasks
from app.gateway.table import DEFAULT_ROUTE_POLICY, GatewaySnapshot, RoutePolicy
from app.gateway.waiter import HoldOutcome, Waiter, waits_for_its_own

RETIRED_LINGER_S = 30.0
"""How long a replica taken out of routing stays in ``in_flight()`` once it is idle."""
MIN_BOUND = 4
"""No replica's bound (``prefix``, ``session``) is below this many requests: an engine
batches a handful at no cost to any of them, and passing a key on to an idle replica at
such loads would cost its cache and gain nothing."""


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
        self._queue_limit = queue_limit
        self._scrapers = ScraperTasks(interval_s=scrape_interval_s, timeout_s=scrape_timeout_s)
        self._clock = clock
        self._draw = draw
        # A scrape still within its timeout has not failed: the next reading is due up to
        # an interval and a timeout after the last one, and until then the last one stands
        # (else a busy engine's slow /metrics flips its replica to the in-flight rule).
        self._stale_after_s = max(
            STALE_AFTER_INTERVALS * scrape_interval_s, scrape_interval_s + scrape_timeout_s
        )
        self.retry_after_s = float(max(1, math.ceil(4 * scrape_interval_s)))
        """What ``Saturated`` tells clients: a few scrapes' time, at least a second."""
        self._replicas: dict[str, ReplicaState] = {}
        self._by_model: dict[str, list[ReplicaState]] = {}
        self._pools: dict[str, Pool] = {}
        self._splits: dict[str, CanarySplit] = {}
        self._policies: dict[str, RoutePolicy] = {}
        self._rendezvous: dict[tuple[tuple[str, float], ...], Rendezvous] = {}
        self._decisions: Counter[tuple[str, str, RouteReason]] = Counter()
        self._retired: dict[str, ReplicaState] = {}
        self._queues: dict[str, FairQueue[Waiter]] = {}
        self._queued = 0
        self._queued_by_key: Counter[str] = Counter()
        self._cold_start_s: dict[str, float] = {}
        self._declared: frozenset[str] = frozenset()
        self._holds: Counter[tuple[str, HoldOutcome]] = Counter()
        self._on_hold: Callable[[], None] | None = None
        self._held_models: set[str] = set()
        """Models whose waiters are held for a cold start: each went to zero (or had
        requests held from zero) since it last had a route."""
        self._stopping = False
        self._session: aiohttp.ClientSession | None = None
        self.ejector = Ejector(ejection, clock)

    def on_hold(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the router's loop) whenever a request for a model starting
        from zero is held and none was held for it before, and whenever a model with
        requests waiting loses its last route."""
        self._on_hold = listener

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
        self._splits = canary_splits(snapshot, self._by_model)
        self.ejector.track(
            {
                model: [s.route.replica_id for s in states]
                for model, states in self._by_model.items()
            }
        )
        self._pools = {model: Pool(replicas) for model, replicas in self._by_model.items()}
        self._policies = dict(snapshot.policies)
        self._build_rendezvous()
        self._cold_start_s = dict(snapshot.cold_start_s)
        self._held_models = {
            m for m in self._held_models if m not in self._by_model and m in self._cold_start_s
        }
        for model, queue in self._queues.items():
            if (hold_s := self._cold_start_s.get(model)) is not None:
                for waiter in queue:
                    waiter.shorten_hold(hold_s)
        removed = self._declared - snapshot.declared
        self._declared = snapshot.declared
        for model in list(self._queues):
            self._fail_unroutable(model, removed=model in removed)
            self._dispatch(model)

    def _build_rendezvous(self) -> None:
        """Give each pool of a model whose policy hashes its rendezvous: the one it had when
        its members and weights are unchanged, else a new one."""
        built: dict[tuple[tuple[str, float], ...], Rendezvous] = {}
        for model, pool in self._pools.items():
            if self.policy_of(model).policy == "least_loaded":
                continue
            split = self._splits.get(model)
            for each in (pool,) if split is None else (pool, split.canary, split.stable):
                members = each.keyed_members()
                rendezvous = (
                    built.get(members) or self._rendezvous.get(members) or Rendezvous(members)
                )
                built[members] = each.rendezvous = rendezvous
        self._rendezvous = built

    def policy_of(self, model: str) -> RoutePolicy:
        return self._policies.get(model, DEFAULT_ROUTE_POLICY)

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
        hold_s = self._hold_s(model)
        if hold_s is None and not self._has_candidates(model, exclude):
            raise NoServingReplica(model)
        if hold_s is not None and self._stopping:
            raise GatewayStopping(model)
        queue = self._queues.get(model)
        if hold_s is None and not queue:
            chosen = self._choose(model, exclude, route_key)
            if chosen is not None:
                return self._lease(model, chosen, 0.0)
        if self._queued >= self._queue_limit and not self._make_room_for(key_id):
            raise Saturated(self.retry_after_s, starting=hold_s is not None)
        if hold_s is None and self._queue_timeout_s <= 0:
            raise Saturated(self.retry_after_s)
        waiter = Waiter(
            model, key_id, exclude, asyncio.get_running_loop().create_future(), route_key
        )
        waiter.enqueued_at = self._clock()
        waiter.hold_s = hold_s
        self._queues.setdefault(model, FairQueue()).push(key_id, waiter)
        self._queued += 1
        self._queued_by_key[key_id] += 1
        if hold_s is None:
            self._dispatch(model)
        else:
            self._held_from_now(model, (), wake=not queue)
        try:
            timeout_s = self._queue_timeout_s if hold_s is None else hold_s
            async with asyncio.timeout(timeout_s) as deadline:
                waiter.deadline = deadline
                lease = await waiter.future
        except TimeoutError:
            self._abandon(waiter)
            if waiter.hold_s is None:
                raise Saturated(self.retry_after_s) from None
            self._holds[model, "timed_out"] += 1
            if model in self._by_model:  # a replica came, but had no room in time
                raise Saturated(self.retry_after_s) from None
            retry_after_s = max(self.retry_after_s, cold_start_retry_after_s(waiter.hold_s))
            raise ColdStartTimedOut(model, waiter.hold_s, retry_after_s) from None
        except BaseException as exc:
            self._abandon(waiter)
            if waiter.hold_s is not None:
                ended: HoldOutcome = (
                    "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
                )
                self._holds[model, ended] += 1
            raise
        if waiter.hold_s is not None:
            self._holds[model, "served"] += 1
        return lease

    def _hold_s(self, model: str) -> float | None:
        """How long a request for ``model`` is held: its cold-start timeout while it has no
        route at all; ``None`` when it has a route, or no autoscaling policy."""
        if model in self._by_model:
            return None
        return self._cold_start_s.get(model)

    def _has_candidates(self, model: str, exclude: frozenset[str]) -> bool:
        return any(s.route.replica_id not in exclude for s in self._by_model.get(model, ()))

    def _lease(
        self, model: str, chosen: tuple[ReplicaState, RouteReason], queued_s: float
    ) -> Lease:
        state, reason = chosen
        policy = self.policy_of(model).policy
        self._decisions[model, policy, reason] += 1
        return Lease(self, self.ejector, state, queued_s, policy, reason)

    def _choose(
        self, model: str, exclude: frozenset[str], route_key: RouteKey | None = None
    ) -> Choice:
        pool = self._pools.get(model)
        if pool is None:
            return None
        now = self._clock()
        # Passive health: replicas this gateway ejected are passed over (app.gateway.ejection).
        if shunned := self.ejector.shunned(model, exclude):
            exclude = exclude | shunned
        policy = self.policy_of(model)
        split = self._splits.get(model)
        if split is None:
            return self._choose_among(pool, exclude, now, policy, route_key)
        # A keyed request draws from its key: its turns stay on one side, in every gateway.
        if route_key is not None and policy.policy != "least_loaded":
            draw = key_fraction(route_key.value)
        else:
            draw = self._draw()
        if draw < split.share:
            drawn, other = split.canary, split.stable
        else:
            drawn, other = split.stable, split.canary
        chosen = self._choose_among(drawn, exclude, now, policy, route_key)
        if chosen is not None:
            return chosen
        return self._choose_among(other, exclude, now, policy, route_key)

    def _choose_among(
        self,
        pool: Pool,
        exclude: frozenset[str],
        now: float,
        policy: RoutePolicy,
        route_key: RouteKey | None,
    ) -> Choice:
        rendezvous = pool.rendezvous
        if route_key is not None and rendezvous is not None:
            by_id, stale_after_s = pool.by_id, self._stale_after_s

            def refuse(replica_id: str) -> bool:
                return (
                    assess(
                        by_id[replica_id],
                        now=now,
                        stale_after_s=stale_after_s,
                        max_in_flight=policy.max_in_flight,
                    )
                    is None
                )

            pick = rendezvous.pick(
                route_key.value,
                load_of=lambda replica_id: carried(
                    by_id[replica_id], now=now, stale_after_s=stale_after_s
                ),
                load_factor=policy.load_factor,
                refuse=refuse,
                absent=exclude,
                min_bound=MIN_BOUND,
                counted_of=lambda replica_id: counted(
                    by_id[replica_id], now=now, stale_after_s=stale_after_s
                ),
            )
            if pick.member is not None:
                return by_id[pick.member], KEYED_REASONS[pick.reason]
        replicas: Sequence[ReplicaState] = pool.replicas
        if exclude:
            replicas = [s for s in replicas if s.route.replica_id not in exclude]
        chosen = choose(
            replicas,
            now=now,
            stale_after_s=self._stale_after_s,
            max_in_flight=policy.max_in_flight,
        )
        if chosen is None:
            return None
        if policy.policy == "least_loaded":
            return chosen, "least_loaded"
        return chosen, "no_key" if route_key is None else "fallback"

    def _dispatch(self, model: str) -> None:
        """Grant leases to waiters of ``model``, in fair order, while replicas have room."""
        queue = self._queues.get(model)
        while queue:
            memo: dict[tuple[frozenset[str], RouteKey | None], Choice] = {}
            granted = queue.pop_first(
                functools.partial(self._choose_for_waiter, model, memo), waits_for_its_own
            )
            if granted is None:
                break
            waiter, chosen = granted
            self._dequeued(waiter)
            if waiter.future.done():
                continue  # cancelled; its task has not run yet to take it out
            waiter.future.set_result(self._lease(model, chosen, self._clock() - waiter.enqueued_at))
        if queue is not None and not queue:
            del self._queues[model]

    def _make_room_for(self, key_id: str) -> bool:
        """The queue is full: the key with the most requests waiting gives up its newest
        (answered 429, as a full queue answers) to ``key_id`` when that leaves it with no
        fewer than ``key_id`` then has. A full queue so ends up shared evenly among the keys
        that want it, and one key's flood cannot lock the others out of it. Whether room
        was made."""
        heaviest, most = max(self._queued_by_key.items(), key=lambda item: item[1])
        if most < self._queued_by_key[key_id] + 2:
            return False
        newest = [
            waiter
            for queue in self._queues.values()
            if (waiter := queue.newest(heaviest)) is not None
        ]
        victim = max(newest, key=lambda waiter: waiter.enqueued_at)
        queue = self._queues[victim.model]
        queue.remove(heaviest, victim)
        self._dequeued(victim)
        if not queue:
            del self._queues[victim.model]
        if not victim.future.done():
            victim.future.set_exception(
                Saturated(self.retry_after_s, starting=victim.hold_s is not None)
            )
        return True

    def _dequeued(self, waiter: Waiter) -> None:
        self._queued -= 1
        left = self._queued_by_key[waiter.key_id] - 1
        if left > 0:
            self._queued_by_key[waiter.key_id] = left
        else:
            del self._queued_by_key[waiter.key_id]

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
            memo[asked] = self._choose(model, waiter.exclude, waiter.route_key)
        return memo[asked]

    def _abandon(self, waiter: Waiter) -> None:
        """The waiter gave up (its task was cancelled, which also cancels its future): take
        it out of the queue, or hand back a lease granted just before."""
        queue = self._queues.get(waiter.model)
        if queue is not None and queue.remove(waiter.key_id, waiter):
            self._dequeued(waiter)
            if not queue:
                del self._queues[waiter.model]
        future = waiter.future
        if not future.done():
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            future.result().release()

    def _fail_unroutable(self, model: str, *, removed: bool = False) -> None:
        """Fail the waiters of ``model`` that no replica can take; unless the model is
        starting from zero: then its waiters are held for the cold start. ``removed``: the
        table that took the model's routes away no longer declares it."""
        queue = self._queues.get(model)
        if queue is None:
            return
        hold_s = self._hold_s(model)
        if hold_s is not None:
            if model not in self._held_models:  # it lost its last route since
                self._held_from_now(model, list(queue))
            return
        for waiter in [w for w in queue if not self._has_candidates(model, w.exclude)]:
            queue.remove(waiter.key_id, waiter)
            self._dequeued(waiter)
            if not waiter.future.done():
                refusal = ModelRemoved(model) if removed else NoServingReplica(model)
                waiter.future.set_exception(refusal)
        if not queue:
            del self._queues[model]

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
        for model, queue in list(self._queues.items()):
            for waiter in [w for w in queue if w.hold_s is not None]:
                queue.remove(waiter.key_id, waiter)
                self._dequeued(waiter)
                turned_away += 1
                if not waiter.future.done():
                    waiter.future.set_exception(GatewayStopping(model))
            if not queue:
                del self._queues[model]
        return turned_away

    def capacity_freed(self, state: ReplicaState) -> None:
        """A lease's replica has room again (``CapacityReturn``, told by ``Lease``): the
        next waiter for its model is dispatched; a retired replica that went idle starts
        the linger after which it is forgotten."""
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
        self._queued_by_key.clear()

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
        """Requests waiting for a replica, per model (those held for a cold start too)."""
        return {model: len(queue) for model, queue in self._queues.items()}

    def route_decisions(self) -> dict[tuple[str, str, str], int]:
        """Requests given a replica, by model, routing policy and reason (``RouteReason``)."""
        return {decision: count for decision, count in self._decisions.items()}

    def cold_start_holds(self) -> dict[tuple[str, str], int]:
        """Requests held for a cold start that ended, by model and how they ended
        (``HoldOutcome``)."""
        return {ended: count for ended, count in self._holds.items()}
