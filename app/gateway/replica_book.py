"""The gateway's account of the replicas it routes to (``ReplicaState``): those of the last
routing table, and those taken out of it while their requests finish.

Per replica it keeps the gateway's own counts (``in_flight``: requests open;
``reserved``: requests sent that the engine's metrics cannot show yet) and the latest
engine signals, read by a scraper task per replica (``app.gateway.signals``). A replica
kept from one table to the next keeps its counts and signals; one whose URL changed loses
its signals and its scraper starts again. One taken out of routing is retired: it gets no
new requests, and its in-flight ones are still reported (``in_flight()``) until it has been
idle for ``RETIRED_LINGER_S``.

A reservation ends at the first byte of the answer, or earlier once a scrape that started
at least one full scrape after the request was sent has answered: by then the engine
counts the request itself (as waiting or running), and counting it twice would keep a
replica with long non-streaming requests saturated.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from app.gateway.admission import (
    STALE_AFTER_INTERVALS,
    ReplicaState,
    ReplicaView,
    Signals,
    is_fresh,
)
from app.gateway.signals import EngineReading, ScraperTasks
from app.gateway.table import GatewaySnapshot, Route, models_changed

RETIRED_LINGER_S = 30.0
"""How long a replica taken out of routing stays in ``in_flight()`` once it is idle."""


class ReplicaBook:
    """Every replica's ``ReplicaState``, kept across routing tables, and its scraper.
    ``on_report`` is called with a replica's model after each of its scrapes, read or
    failed: its signals may have made room."""

    __slots__ = (
        "_clock",
        "_on_report",
        "_replicas",
        "_retired",
        "_scrapers",
        "_session",
        "_taken",
        "by_model",
        "stale_after_s",
    )

    def __init__(
        self,
        *,
        scrape_interval_s: float,
        scrape_timeout_s: float,
        clock: Callable[[], float],
        on_report: Callable[[str], None],
    ) -> None:
        self._scrapers = ScraperTasks(interval_s=scrape_interval_s, timeout_s=scrape_timeout_s)
        self._clock = clock
        self._on_report = on_report
        # A scrape still within its timeout has not failed: the next reading is due up to
        # an interval and a timeout after the last one, and until then the last one stands
        # (else a busy engine's slow /metrics flips its replica to the in-flight rule).
        self.stale_after_s = max(
            STALE_AFTER_INTERVALS * scrape_interval_s, scrape_interval_s + scrape_timeout_s
        )
        """How old signals may be before admission goes by the in-flight count instead."""
        self._replicas: dict[str, ReplicaState] = {}
        self._retired: dict[str, ReplicaState] = {}
        self.by_model: dict[str, list[ReplicaState]] = {}
        """The routed replicas of each model with one: read it, never change it. A model's
        list is the same object for as long as its routes are the same tuple."""
        self._taken: dict[str, tuple[Route, ...]] = {}
        """The routes of each model as last taken: a model whose tuple is this one again
        is passed over."""
        self._session: aiohttp.ClientSession | None = None

    def take(self, snapshot: GatewaySnapshot) -> None:
        """Take the routes of a new snapshot; kept replicas keep their counts and signals.
        Only the models whose routes are not the tuple taken before are looked at: the
        others' replicas, their states and their model's list in ``by_model`` stay as
        they are."""
        changed = models_changed(self._taken, snapshot.routes)
        lists: dict[str, list[ReplicaState]] = {}
        fresh: dict[str, ReplicaState] = {}
        for model in changed:
            states = []
            for route in snapshot.routes.get(model, ()):
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
                states.append(state)
            lists[model] = states
        for model in changed:
            for state in self.by_model.get(model, ()):
                replica_id = state.route.replica_id
                if replica_id not in fresh:
                    self._scrapers.stop(replica_id)
                    self._retire(state)
                    del self._replicas[replica_id]
        self._replicas.update(fresh)
        self._forget_idle_retired()
        self.by_model = {
            model: lists[model] if model in lists else self.by_model[model]
            for model, routes in snapshot.routes.items()
            if routes
        }
        self._taken = dict(snapshot.routes)
        if self._session is not None:
            for state in fresh.values():
                if state.route.replica_id not in self._scrapers:
                    self._start_scraper(state, self._session)

    def freed(self, state: ReplicaState) -> bool:
        """A request of ``state`` ended, or its reservation did: whether it is routed (its
        room may go to a waiter). A retired replica that went idle starts the linger after
        which it is forgotten."""
        if self._retired.get(state.route.replica_id) is state:
            if state.in_flight == 0 and state.retired_idle_since is None:
                state.retired_idle_since = self._clock()
            return False
        return True

    def reported(self, replica_id: str, scrape: int, reading: EngineReading | None) -> None:
        """Scrape number ``scrape`` of routed replica ``replica_id``'s engine read
        ``reading`` (``None``: it failed, and the last signals stand until they are stale).
        Each scraper reports so; a reading taken another way is given the same way."""
        state = self._replicas[replica_id]
        if reading is not None:
            state.signals = Signals(
                waiting=reading.waiting,
                running=reading.running,
                kv_usage=reading.kv_usage,
                scraped_at=self._clock(),
                absent=reading.absent,
            )
            state.absorb_reservations(scrape)
        self._on_report(state.route.model)

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

    def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        for state in self._replicas.values():
            if state.route.replica_id not in self._scrapers:
                self._start_scraper(state, session)

    async def close(self) -> None:
        self._session = None
        await self._scrapers.close()

    def _start_scraper(self, state: ReplicaState, session: aiohttp.ClientSession) -> None:
        replica_id = state.route.replica_id

        def report(scrape: int, reading: EngineReading | None) -> None:
            # A scraper stopped while its report was on its way: its replica left routing,
            # or came back as another state.
            if self._replicas.get(replica_id) is state:
                self.reported(replica_id, scrape, reading)

        self._scrapers.start(replica_id, state.route.url, session, state.begin_scrape, report)

    # -- what the gateway publishes --------------------------------------------------------

    def in_flight(self) -> dict[str, int]:
        """Requests open per replica, also for replicas recently taken out of routing."""
        self._forget_idle_retired()
        counts = {rid: s.in_flight for rid, s in self._retired.items()}
        counts.update((rid, s.in_flight) for rid, s in self._replicas.items())
        return counts

    def views(self) -> list[ReplicaView]:
        now = self._clock()
        return [s.view(now, self.stale_after_s) for s in self._replicas.values()]

    def stale(self) -> int:
        """How many routed replicas have no fresh signals."""
        now = self._clock()
        return sum(
            not is_fresh(s.signals, now=now, stale_after_s=self.stale_after_s)
            for s in self._replicas.values()
        )
