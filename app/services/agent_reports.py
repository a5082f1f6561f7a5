"""What agents report, taken in: folded into the live fleet view, then recorded in the log.

The agent hub converts what its sessions observe into ``app.domain.reports`` at its edge
and hands each report to ``LiveView.handle``, which folds it into the view
(``app.domain.reports.observe``) and passes it to ``ReportRecorder.handle``, which
decides against the log (``app.domain.agent_reports.decide``) and appends with the agent
as actor.

The live view. The reconciler decides on the log and the view together, so it must never
see one without the other: a hello in the view whose ``node_connected`` is not appended yet
makes a stray on a new node go unrecorded, and a ``node_connected`` whose hello is not in
the view reads as a node that never came back. ``LiveView.quiet()`` gives that guarantee:
inside it no report is half recorded, and reports that arrive wait until it ends (they may
run together with each other otherwise). That gate is all the class adds to the pure fold.

The recorder. Reports about one node are recorded one at a time, in the order they arrive,
so a node's events reach the log in the order its agent caused them (a disconnect can
never overtake the connect before it). A node's turn is kept only while a report holds or
waits for it (``wire.turns``): every node that ever connected, and every name a
refused connection claimed, would otherwise keep one for ever. Appends check the version
of every stream they write; when another writer moved one first, the decision is made
again on the new state. An append refused because another leader took over
(``FencedError``) calls ``on_fenced`` before it is raised, so the leader stops at once.

GPU health goes through each node's ``FlapGuard`` first: a GPU that flaps is held
unhealthy (one event) instead of reaching the log with every flip, and released on a later
heartbeat once it has been stable. A hello forgets the GPUs it no longer lists; the guard of
a node that left is dropped once nothing it remembers matters (``FlapGuard.settled``), so
the guards hold the GPUs of the nodes connected and of those gone recently, no more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Protocol

import msgspec
import structlog

from app.clock import utc_now
from app.domain import agent_reports
from app.domain.envelope import Meta
from app.domain.events import NodeConnected, ShardFailed, event_type
from app.domain.gpu_claims import gpus_held_elsewhere
from app.domain.gpu_flaps import FlapGuard, FlapPolicy
from app.domain.reports import (
    AgentConnected,
    AgentDisconnected,
    AgentInventory,
    AgentReport,
    CommandAnswered,
    FleetView,
    GpuHealth,
    HeartbeatReport,
    IdentityClaim,
    ModelOf,
    Refusal,
    ShardStatusReport,
    command_sent,
    command_settled,
    observe,
    reporting_node,
)
from app.domain.state import ClusterState
from app.store.errors import ConcurrencyError, FencedError
from app.store.interface import AppendRequest, EventStore, NewEvent
from wire.turns import Turns

SWEEP_EVERY_S = 10.0
"""How often the guards of nodes gone are looked at, to drop those that settled."""
HUB_ACTOR = "agent-hub"
"""The actor of events about refused connections: what a refused connection says is not
taken as its node's word."""
MAX_ATTEMPTS = 5

log = structlog.get_logger(__name__)


def agent_actor(node_id: str) -> str:
    return f"agent:{node_id}"


class ReportHandler(Protocol):
    """What reports go on to: ``ReportRecorder``."""

    async def handle(self, report: AgentReport) -> None: ...


class LiveView:
    def __init__(
        self,
        recorder: ReportHandler,
        *,
        model_of: ModelOf = lambda _: None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._recorder = recorder
        self._model_of = model_of
        self._clock = clock
        self.last_hello_at: datetime | None = None
        """When the last hello came (it keeps the adoption grace open)."""
        self._view = FleetView()
        self._listeners: list[Callable[[], None]] = []
        self._gate = _Gate()

    def snapshot(self) -> FleetView:
        """The view now; never changed afterwards (a change builds a new one)."""
        return self._view

    def greeting(self, node_id: str) -> int | None:
        """A number that changes with every hello of the node; None while it is away."""
        return self._view.greeting(node_id)

    def sending(self, node_id: str, command_id: str, at: datetime) -> None:
        """The command is about to be sent to the node, ``at`` by the reconciler's clock:
        awaited until the agent answers it (said before the send, so an answer cannot come
        first)."""
        self._view = command_sent(self._view, node_id, command_id, at)

    def not_sent(self, node_id: str, command_id: str) -> None:
        """The command announced by ``sending`` did not go: no answer will come."""
        self._view = command_settled(self._view, node_id, command_id)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every report that changed the view."""
        self._listeners.append(listener)

    def quiet(self) -> AbstractAsyncContextManager[None]:
        """``async with view.quiet():`` read the log's state and ``snapshot()`` in step."""
        return self._gate.exclusive()

    async def handle(self, report: AgentReport) -> None:
        if isinstance(report, AgentConnected):
            self.last_hello_at = self._clock()
        async with self._gate.shared():
            before = self._view
            self._view = observe(before, report, self._model_of)
            try:
                await self._recorder.handle(report)
            finally:
                if self._view is not before:
                    for listener in self._listeners:
                        listener()


class _Gate:
    """Many observers at once, or one reader alone. A waiting reader holds new observers
    back, so a steady stream of observations cannot starve the reconciler. Leaving either
    side takes no await, so a cancelled observer or reader cannot leave the gate shut."""

    def __init__(self) -> None:
        self._observing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._reader = asyncio.Lock()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while not self._open.is_set():
            await self._open.wait()
        self._observing += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._observing -= 1
            if self._observing == 0:
                self._idle.set()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._reader:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()


class ReportRecorder:
    def __init__(
        self,
        store: EventStore,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        epoch: int | None = None,
        flap_policy: FlapPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_fenced: Callable[[str], None] = lambda _: None,
    ) -> None:
        """``epoch``: the leader epoch of this control plane, carried in every append so a
        deposed leader's agent events are refused like its own (``FencedError``)."""
        self._store = store
        self._max_attempts = max_attempts
        self._epoch = epoch
        self._flap_policy = flap_policy or FlapPolicy()
        self._clock = clock
        self._on_fenced = on_fenced
        self._turns: Turns[str] = Turns()
        """Each node's turn to be recorded, kept only while a report holds or waits for it."""
        self._flaps: dict[str, FlapGuard] = {}
        self._away: set[str] = set()
        """Nodes gone whose guards are kept until they settle."""
        self._next_sweep_at = clock()

    async def handle(self, report: AgentReport) -> None:
        """Record what ``report`` changes.

        Raises the store's errors (``ConcurrencyError`` after ``max_attempts`` lost races,
        ``FencedError`` once another leader took over, ``StoreError`` when the database
        fails); nothing was written for this report then.
        """
        recorded = self._debounced(report)
        if recorded is None:
            return
        node_id = reporting_node(recorded)
        refused = isinstance(recorded, IdentityClaim | Refusal)
        actor = HUB_ACTOR if refused else agent_actor(node_id)
        # No await before the lock is taken: reports queue in the order they came.
        async with self._turns.of(node_id):
            try:
                await self._decide_and_append(recorded, actor)
            except FencedError as exc:
                self._on_fenced(str(exc))
                raise

    async def _decide_and_append(self, report: AgentReport, actor: str) -> None:
        for attempt in range(1, self._max_attempts + 1):
            # Decided on the store's fold and appended with the versions of that fold: no
            # read before the write. If another writer moved a stream meanwhile, the store
            # refuses the append, catches up, and we decide again.
            decision = agent_reports.decide(self._store.state, report)
            if not decision:
                return
            versions = {s: self._store.known_version(s) for s in _streams(decision)}
            try:
                await self._store.append_many(
                    _requests(decision, versions), self._meta(report, actor)
                )
            except ConcurrencyError as exc:
                if attempt == self._max_attempts:
                    raise
                log.info("fleet_decision_conflicted", stream=exc.stream, attempt=attempt)
                await self._store.catch_up()
                continue
            log.info("fleet_events_recorded", actor=actor, events=_types(decision))
            _warn_of_failures(decision, self._store.state)
            _warn_of_gpus_held_elsewhere(decision, self._store.state)
            return

    def _meta(self, report: AgentReport, actor: str) -> Meta:
        """Who, in which epoch, and the cause: the command a shard's new state answers, or
        the command whose answer this is (the hub keeps a status's cause, and the domain
        records an answer, only for a command the hub sent the node)."""
        cause: str | None = None
        if isinstance(report, ShardStatusReport | CommandAnswered):
            cause = report.command_id
        return Meta(actor=actor, epoch=self._epoch, causation_id=cause)

    def nodes_in_turn(self) -> int:
        """The nodes with a report being recorded or waiting to be."""
        return len(self._turns)

    def remembered_gpus(self) -> int:
        """The GPUs the flap guards remember, over every node."""
        return sum(len(guard) for guard in self._flaps.values())

    def _debounced(self, report: AgentReport) -> AgentReport | None:
        """``report`` with GPU health as the log should hear it; None when nothing is left
        to record (a heartbeat that changes nothing)."""
        self._forget_settled(self._clock())
        match report:
            case AgentConnected(inventory=inventory):
                self._away.discard(inventory.node_id)
                return msgspec.structs.replace(report, inventory=self._held(inventory))
            case AgentDisconnected(node_id=node_id):
                if node_id in self._flaps:
                    self._away.add(node_id)
                return report
            case HeartbeatReport(node_id=node_id, gpu_changes=reported):
                guard, now = self._guard(node_id), self._clock()
                changes = guard.observe(reported, now) + guard.release(now)
                if not changes:
                    return None
                return msgspec.structs.replace(report, gpu_changes=tuple(changes))
            case CommandAnswered():
                log.info(  # the hub's connection handler has bound the node
                    "agent_command_completed",
                    command_id=report.command_id,
                    ok=report.ok,
                    error=report.error,
                    sent=report.sent,
                )
                return report  # a start it refused fails its shard: the domain decides
            case _:
                return report

    def _guard(self, node_id: str) -> FlapGuard:
        return self._flaps.setdefault(node_id, FlapGuard(self._flap_policy))

    def _forget_settled(self, now: float) -> None:
        """Drop the guards of nodes gone whose GPUs have settled (at most every
        ``SWEEP_EVERY_S``): a node that comes back is judged afresh, as a hold would be
        released at its first heartbeat."""
        if now < self._next_sweep_at:
            return
        self._next_sweep_at = now + SWEEP_EVERY_S
        for node_id in [n for n in self._away if self._flaps[n].settled(now)]:
            self._away.discard(node_id)
            del self._flaps[node_id]

    def _held(self, inventory: AgentInventory) -> AgentInventory:
        """The hello's GPUs as the log should see them: a flapping GPU stays held unhealthy,
        however often its agent reconnects."""
        guard = self._guard(inventory.node_id)
        reported = [
            GpuHealth(index=g.index, uuid=g.uuid, healthy=g.healthy, reason=g.unhealthy_reason)
            for g in inventory.gpus
        ]
        guard.retain(reported)
        guard.observe(reported, self._clock())
        held = {health.index: guard.health(health) for health in reported}
        gpus = tuple(
            msgspec.structs.replace(
                gpu, healthy=held[gpu.index].healthy, unhealthy_reason=held[gpu.index].reason
            )
            for gpu in inventory.gpus
        )
        return msgspec.structs.replace(inventory, gpus=gpus)


def _warn_of_failures(decision: agent_reports.Decision, state: ClusterState) -> None:
    """A failed engine is a warning here as on its agent, naming the replica, its model and
    why (``fleet_events_recorded`` only counts the events); the hub's connection handler
    has bound the node."""
    for _, event in decision:
        if isinstance(event, ShardFailed):
            replica = state.replicas.get(event.replica_id)
            log.warning(
                "replica_shard_failed",
                replica_id=event.replica_id,
                shard_index=event.shard_index,
                model=replica.model if replica is not None else None,
                error=event.error,
                exit_code=event.exit_code,
            )


def _warn_of_gpus_held_elsewhere(decision: agent_reports.Decision, state: ClusterState) -> None:
    """A hello listing a GPU whose UUID another connected node holds is a warning, once
    per hello, naming each such GPU and the holder (``app.domain.gpu_claims``): placement
    puts nothing new on it."""
    for _, event in decision:
        if not isinstance(event, NodeConnected):
            continue
        elsewhere = gpus_held_elsewhere(state.nodes.values()).get(event.node_id)
        if not elsewhere:
            continue
        uuids = {gpu.index: gpu.uuid for gpu in event.gpus}
        log.warning(
            "gpu_uuid_held_elsewhere",
            node_id=event.node_id,
            gpus=[
                f"{index} ({uuids.get(index, '')}) held by {holder}"
                for index, holder in sorted(elsewhere.items())
            ],
            reason="another connected node, connected longer, lists the same GPU UUID: "
            "no new shard is placed on these GPUs",
        )


def _types(decision: agent_reports.Decision) -> list[str]:
    return [event_type(event) for _, event in decision]


def _streams(decision: agent_reports.Decision) -> set[str]:
    return {stream for stream, _ in decision}


def _requests(decision: agent_reports.Decision, versions: dict[str, int]) -> list[AppendRequest]:
    """One request per stream, streams in the order the decision first names them."""
    by_stream: dict[str, list[NewEvent]] = {}
    for stream, event in decision:
        by_stream.setdefault(stream, []).append(NewEvent(event))
    return [AppendRequest(stream, versions[stream], events) for stream, events in by_stream.items()]
