"""The reconcile loop: load, decide, append, send, again.

A pass reads the log (``store.catch_up()``) and the live fleet view in step, with what
gateways report in flight (read just before: it only delays stopping a replica, so it need
not be in step), asks ``app.domain.reconcile.decide`` what to do, appends the events it
returns and only then sends the commands, so no agent is ever told to run something the
log does not hold.
Passes run every ``interval_s`` and at once when woken: by a change in the fleet view, by
an append anywhere (the leader wires NOTIFY to ``wake``) and after a lost race.

Events are appended in the order decided. Consecutive events with the same correlation id
go in one ``append_many`` (one transaction), since the correlation id is part of the
append's ``Meta``; a pass that decided ``a(x), b(x), c(y), d(x)`` makes three appends.

- ``ConcurrencyError``: another writer moved a stream first (a model's stream the pass
  read, or one an operator's change makes the run wrong on: ``overtaken``).
  Nothing more is appended or sent; the next pass (right away) decides again on the
  caught-up log.
- ``FencedError``: another leader took over. ``run`` raises it; the caller stops leading.
  A pass raises it too, before deciding, when the log it caught up with holds an event of
  a newer epoch: a pass that appends nothing would otherwise send its commands unfenced.
- ``StoreError`` otherwise (the database is unreachable): logged; the next pass retries.

Commands go out through ``app.services.command_sending.CommandSender``: a command id
already sent to a node is not sent again until that node says hello again, and a node
without a connection is skipped (the next pass sends it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime
from time import monotonic
from typing import Literal, Protocol

import msgspec
import structlog

from app.clock import utc_now
from app.domain import autoscale
from app.domain.adoption_grace import Arrivals, GraceState
from app.domain.autoscale_heard import heard_within, replicas_to_hear
from app.domain.decision import Decision, PlannedEvent
from app.domain.envelope import Meta
from app.domain.events import MODEL_STREAM_PREFIX, event_type
from app.domain.hold_ejections import ejections_wanted
from app.domain.reconcile import (
    Settings,
    adoption_grace_state,
    decide,
    note_left_routing,
    overtaken,
)
from app.domain.reports import NO_GATEWAYS, GatewaysInFlight
from app.domain.rollout_reads import traffic_wanted
from app.domain.state import ClusterState
from app.domain.traffic import TrafficFigures
from app.services.agent_reports import LiveView
from app.services.command_sending import CommandChannel, CommandSender
from app.store.errors import AppendOutcomeUnknown, ConcurrencyError, FencedError, StoreError
from app.store.gateway_reports import Ejections
from app.store.interface import AppendRequest, EventStore, NewEvent

DEFAULT_INTERVAL_S = 1.0
PASSES_KEPT = 100
IMMEDIATE_RETRIES = 3
"""Lost races in a row that are retried at once; after that, at the usual interval."""

log = structlog.get_logger(__name__)

Hearing = Literal["heard", "partial", "unknown"]

_HoldReads = tuple[dict[str, list[str]], frozenset[str]]
"""What a pass reads of the gateways for rollouts holding a step: the groups a verdict
judges (``traffic_wanted``), and the replicas whose ejections are recorded
(``ejections_wanted``)."""


def _hold_reads(state: ClusterState) -> _HoldReads:
    return traffic_wanted(state), ejections_wanted(state)


class InFlightSource(Protocol):
    """What gateways report: ``app.store.gateway_reports.InFlightReports``. Requests in
    flight per replica, read every pass; requests held queued per model, when a model is
    autoscaled; and what they measured of groups of replicas, when a rollout's verdict
    needs it or a model may go to zero (whether its requests are in their windows), and
    which replicas they keep out of rotation for failing."""

    async def read_gateways(self) -> GatewaysInFlight: ...

    async def read_queued(self) -> dict[str, int]: ...

    async def traffic_of_groups(
        self, groups: Mapping[str, Collection[str]]
    ) -> dict[str, TrafficFigures]: ...

    async def ejections(self) -> Ejections: ...


class PassReport(msgspec.Struct, frozen=True, kw_only=True):
    """One pass, for logs and metrics. ``outcome``: ``done``, ``conflict`` (a lost race,
    nothing sent) or ``store_error`` (the log could not be read or written)."""

    at: datetime
    duration_s: float
    events: int
    commands: int
    sent: int
    outcome: str


class Reconciler:
    def __init__(
        self,
        store: EventStore,
        hub: CommandChannel,
        tracker: LiveView,
        settings: Settings,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], datetime] = utc_now,
        in_flight: InFlightSource | None = None,
        connections_opening: Callable[[], int] = lambda: 0,
    ) -> None:
        """``connections_opening``: how many agent connections the hub has accepted whose
        handshakes have not finished (they keep the adoption grace open)."""
        if interval_s <= 0:
            raise ValueError(f"the reconcile interval must be positive, not {interval_s}")
        self._store = store
        self._hub = hub
        self._tracker = tracker
        self.settings = settings
        self._interval_s = interval_s
        self._clock = clock
        self._in_flight = in_flight
        self._connections_opening = connections_opening
        self._wake = asyncio.Event()
        self._sender = CommandSender(hub, tracker, clock)
        self._demand: dict[str, tuple[autoscale.DemandSample, ...]] = {}
        """Autoscaled models' demand, sampled every pass: this leader's own memory (a
        leader that starts watches a whole window before it scales anything down)."""
        self.gateways = NO_GATEWAYS
        """What the last pass read of the gateways' reports."""
        self._hearing: Hearing = "heard"
        """What the last pass heard of autoscaled models' demand: from every gateway, from
        some while others are silent, or from none."""
        self._left_routing: dict[str, int] = {}
        """Stopping replicas, with the fold's position where this leader first saw each
        out of routing (``app.domain.shard_commands.note_left_routing``)."""
        self.passes: deque[PassReport] = deque(maxlen=PASSES_KEPT)
        """The last passes, newest last."""
        self.pass_count = 0
        """Every pass since this reconciler started."""
        self.pass_seconds_total = 0.0
        """How long every pass since this reconciler started took, added up."""
        tracker.add_listener(self.wake)

    def last_demand(self) -> dict[str, float]:
        """Each autoscaled model's demand as the last pass sampled it (for ``/metrics``);
        none while no gateway reports, when the demand is unknown."""
        if not self.gateways.live:
            return {}
        return {name: samples[-1].demand for name, samples in self._demand.items() if samples}

    def wake(self) -> None:
        """Run a pass now (or right after the one in progress)."""
        self._wake.set()

    async def run(self) -> None:
        """Pass after pass until cancelled; raises ``FencedError`` once deposed."""
        conflicts = 0
        while True:
            self._wake.clear()
            try:
                report = await self.run_pass()
            except FencedError:
                raise
            except Exception:
                log.exception("reconcile_pass_failed", reconcile_pass=self.pass_count + 1)
            else:
                conflicts = conflicts + 1 if report.outcome == "conflict" else 0
                if 0 < conflicts <= IMMEDIATE_RETRIES:
                    continue
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that arrives as the event is set, and the loop would never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()

    async def run_pass(self) -> PassReport:
        # Every line of this pass, and of the commands it sends, says which pass it was.
        with structlog.contextvars.bound_contextvars(reconcile_pass=self.pass_count + 1):
            return await self._run_pass()

    async def _queued(self, state: ClusterState) -> dict[str, int]:
        """Requests the gateways hold queued per model: read only when a model is
        autoscaled (no query otherwise)."""
        if self._in_flight is None or not any(m.spec.autoscale for m in state.models.values()):
            return {}
        return await self._in_flight.read_queued()

    async def _heard(self, state: ClusterState) -> dict[str, float]:
        """The models that may go to zero whose replicas some live gateway's traffic window
        holds a request of (``app.domain.autoscale_heard``): one query, and only when some
        model may go to zero and has a replica to ask of."""
        groups = replicas_to_hear(state)
        if self._in_flight is None or not any(groups.values()):
            return {}
        return heard_within(await self._in_flight.traffic_of_groups(groups))

    async def _read_for_holds(
        self, wanted: _HoldReads
    ) -> tuple[dict[str, TrafficFigures], dict[str, int]]:
        """What a rollout's hold may need this pass: the gateways' figures of the groups a
        verdict reads (``traffic_wanted``: only a running rollout's), and the replicas of
        holding rollouts, paused ones too, that the gateways eject, each with how many
        gateways do (``ejections_wanted``: recorded for the verdict once resumed). Nothing
        to read (and no query) when no rollout holds a step."""
        groups, members = wanted
        if self._in_flight is None:
            return {}, {}
        traffic = await self._in_flight.traffic_of_groups(groups) if groups else {}
        if not members:
            return traffic, {}
        ejections = await self._in_flight.ejections()
        ejected = {r: n for r, n in ejections.ejected_by.items() if r in members and n > 0}
        return traffic, ejected

    async def _run_pass(self) -> PassReport:
        at, started = self._clock(), monotonic()
        decision = Decision()
        outcome, sent = "done", 0
        try:
            gateways = await self._in_flight.read_gateways() if self._in_flight else NO_GATEWAYS
            self.gateways = gateways
            in_flight = gateways.in_flight
            queued = await self._queued(self._store.state)
            heard = await self._heard(self._store.state)
            wanted = _hold_reads(self._store.state)
            traffic, ejected = await self._read_for_holds(wanted)
            async with self._tracker.quiet():
                state = await self._store.catch_up()
                self._check_still_leading()
                wanted_now = _hold_reads(state)
                if wanted_now != wanted:
                    # The log moved on since the figures were read (an operator resumed a
                    # paused hold through another server, say): a verdict decided now must
                    # not take groups never read for groups no gateway saw a request of, nor
                    # a hold's record miss the ejections of replicas it did not read.
                    traffic, ejected = await self._read_for_holds(wanted_now)
                at = self._clock()
                demand = (
                    autoscale.demand_by_model(state, in_flight, queued) if gateways.live else None
                )
                self._note_hearing(state, gateways)
                self._demand = autoscale.observe(
                    self._demand,
                    demand,
                    state.models,
                    at,
                    pass_interval_s=self._interval_s,
                    partial=gateways.silent > 0,
                    heard=heard,
                )
                self._left_routing = note_left_routing(self._left_routing, state)
                fleet = msgspec.structs.replace(
                    self._tracker.snapshot(),
                    in_flight=in_flight,
                    routing_seen=gateways.routing_seen,
                    silent_gateways=gateways.silent,
                    left_routing=self._left_routing,
                    traffic=traffic,
                    ejected=ejected,
                    demand=self._demand,
                    arrivals=Arrivals(
                        last_hello_at=self._tracker.last_hello_at,
                        connections_opening=self._connections_opening(),
                    ),
                )
                self._note_grace(adoption_grace_state(state, fleet, at, self.settings))
                decision = decide(state, fleet, at, self.settings)
                # No await since the catch-up: the fold's versions are the decision's.
                planned = pinned_to_decision(decision.events, self._store.known_version)
            await self._append(planned)
        except ConcurrencyError as exc:
            log.info("reconcile_pass_conflicted", stream=exc.stream)
            outcome = "conflict"
        except FencedError:
            raise
        except AppendOutcomeUnknown as exc:
            log.warning(
                "reconcile_pass_store_error",
                error=pass_outcome_unknown(exc),
                correlation_id=exc.correlation_id,
            )
            outcome = "store_error"
        except StoreError as exc:
            log.warning("reconcile_pass_store_error", error=str(exc))
            outcome = "store_error"
        else:
            sent = await self._sender.send(decision.commands)
        report = PassReport(
            at=at,
            duration_s=monotonic() - started,
            events=len(decision.events),
            commands=len(decision.commands),
            sent=sent,
            outcome=outcome,
        )
        self.passes.append(report)
        self.pass_count += 1
        self.pass_seconds_total += report.duration_s
        if outcome == "done" and (report.events or sent):
            log.info(
                "reconcile_pass",
                events=report.events,
                event_types=dict(Counter(event_type(p.event) for p in decision.events)),
                correlation_ids=sorted(
                    {p.correlation_id for p in decision.events if p.correlation_id}
                ),
                commands=report.commands,
                sent=sent,
                duration_ms=round(report.duration_s * 1000, 1),
            )
        return report

    def _check_still_leading(self) -> None:
        """A leader paused past its lease, resumed, catches up with what its successor
        appended: nothing of that may become a command from this one (the commands of a
        pass that appends no event meet no fence), so the pass is fenced here."""
        newest = self._store.newest_epoch
        if newest > self.settings.epoch:
            raise FencedError(self.settings.epoch, newest)

    def _note_hearing(self, state: ClusterState, gateways: GatewaysInFlight) -> None:
        """Say once when autoscaled models lose their demand signal (no gateway report is
        fresh: their counts hold) or part of it (a gateway is silent: they do not scale
        down), and once when it is whole again."""
        hearing: Hearing = "heard"
        if (not gateways.live or gateways.silent) and any(
            m.spec.autoscale is not None and not m.removed for m in state.models.values()
        ):
            hearing = "partial" if gateways.live else "unknown"
        if hearing == self._hearing:
            return
        if hearing == "unknown":
            log.warning(
                "autoscale_demand_unknown",
                reason="no gateway has reported recently; autoscaled models keep their count",
            )
        elif hearing == "partial":
            log.warning(
                "autoscale_demand_partial",
                silent_gateways=gateways.silent,
                live_gateways=gateways.live,
                reason="a gateway stopped reporting without stopping cleanly; autoscaled "
                "models scale up on the others' reports but do not scale down",
            )
        else:
            log.info("autoscale_demand_heard")
        self._hearing = hearing

    def _note_grace(self, grace: GraceState) -> None:
        """Once the adoption grace has ended it stays ended: say so, once."""
        if self.settings.adoption_grace_ended or grace is GraceState.OPEN:
            return
        self.settings = msgspec.structs.replace(self.settings, adoption_grace_ended=True)
        log.info(
            "adoption_grace_ended",
            reason=str(grace),
            after_s=round((self._clock() - self.settings.started_at).total_seconds(), 1),
        )

    async def _append(self, events: Sequence[PlannedEvent]) -> None:
        for (correlation_id, actor), run in _runs_by_meta(events):
            requests = [
                AppendRequest(p.stream, p.expected_version, [NewEvent(p.event)]) for p in run
            ]
            meta = Meta(actor=actor, correlation_id=correlation_id, epoch=self.settings.epoch)
            # An operator's change the pass did not decide on may have reached the log since
            # (a node cordoned, a model removed or scaled down): ``overtaken`` says whether
            # the run still stands on the log it is appended to.
            await self._store.append_many(
                requests, meta, still_holds=functools.partial(overtaken, events=run)
            )


def pass_outcome_unknown(exc: AppendOutcomeUnknown) -> str:
    """What a pass whose append may or may not have been recorded logs: the store's words
    for it tell an operator who sent a request to look before asking again; the reconciler
    asks again by itself, on the log as its next pass finds it."""
    return (
        f"the database connection broke while this pass's events were being committed "
        f"({exc.cause}): they may or may not have been recorded, and nothing was sent to the "
        "agents for them; the next pass reads the log and decides again on what it holds"
    )


def pinned_to_decision(
    events: Sequence[PlannedEvent], known_version: Callable[[str], int]
) -> list[PlannedEvent]:
    """``events``, those on a model's stream to be appended only at the stream's version
    the decision was made on (``known_version`` of the fold it read).

    Operators write models' streams (a spec, a scale, a rollout's pause, resume or undo)
    through any control plane, between a pass's catch-up and its append: a pass that
    decided on the model before it (a rollout finished, a verdict, the next step) must not
    be appended after it, or it undoes what the operator just recorded (a rollout said to
    have succeeded after its undo, at the old revision with every replica on the new one).
    A stream that moved on is a ``ConcurrencyError``; the next pass decides again."""
    versions: dict[str, int] = {}
    pinned: list[PlannedEvent] = []
    for planned in events:
        stream = planned.stream
        if planned.expected_version is None and stream.startswith(MODEL_STREAM_PREFIX):
            version = versions.get(stream, known_version(stream))
            planned = msgspec.structs.replace(planned, expected_version=version)
            versions[stream] = version + 1
        pinned.append(planned)
    return pinned


def _runs_by_meta(
    events: Sequence[PlannedEvent],
) -> Iterator[tuple[tuple[str | None, str], list[PlannedEvent]]]:
    """Consecutive events with the same correlation id and actor: one append each."""
    for meta, run in itertools.groupby(events, key=lambda p: (p.correlation_id, p.actor)):
        yield meta, list(run)
