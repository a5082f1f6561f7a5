"""The control plane's composition: standby until elected, then leader until stopped or
deposed.

While standby the server answers the admin API (run beside this by ``llmgw-server
serve``) and keeps asking for leadership; the agent hub does not listen. Once elected with
epoch N, a ``Leader`` runs for that one term:

    agent hub -> LiveView -> ReportRecorder (appends with epoch N)
                    |
                    v  the live fleet view, wakes
              Reconciler (appends with epoch N, sends commands through the hub)
                       ^
    NOTIFY of every append (Subscription) wakes it too

The adapters (the agent hub, the feed of appends, what gateways report) come in a
``LeaderWiring`` built by the composition root, ``app.bootstrap``; this module knows them
by the protocols it needs.

A term ends when the leader lock is lost or an append is fenced; the leader then stops
the hub and the reconciler and ``run`` returns ``Outcome.DEPOSED``. A deposed server does
not try to lead again in the same process: it may hold stale state and half-done work,
and a fresh start (as a standby) is the one path that is known to be right.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol, TypeVar

import structlog

from app.clock import utc_now
from app.domain.adoption_grace import (
    DEFAULT_ADOPTION_GRACE_MAX_S,
    DEFAULT_ADOPTION_GRACE_S,
    DEFAULT_ADOPTION_QUIET_S,
)
from app.domain.envelope import Recorded
from app.domain.events import CertificateRevoked
from app.domain.reconcile import (
    DEFAULT_DRAIN_IDLE_TIMEOUT_S,
    DEFAULT_LOST_TIMEOUT_S,
    DEFAULT_STABILITY_WINDOW_S,
    Settings,
)
from app.domain.revocations import PresentedCertificate, revocation_refusal
from app.services.agent_reports import LiveView, ReportHandler, ReportRecorder
from app.services.command_sending import CommandChannel
from app.services.reconciler import DEFAULT_INTERVAL_S, InFlightSource, Reconciler
from app.store.errors import FencedError, StoreError, StoreUnavailable
from app.store.interface import EventStore

log = structlog.get_logger(__name__)
T = TypeVar("T")
CANCEL_RETRY_S = 0.5
REVOCATION_RETRY_S = 1.0
START_RETRY_S = 5.0
START_RETRY_INTERVAL_S = 0.2


@dataclass(frozen=True)
class ControlPlaneConfig:
    """What a term runs with; the agent hub's own settings are the composition root's."""

    server_id: str
    agent_host: str
    agent_port: int
    adoption_grace_s: float = DEFAULT_ADOPTION_GRACE_S
    adoption_quiet_s: float = DEFAULT_ADOPTION_QUIET_S
    adoption_grace_max_s: float = DEFAULT_ADOPTION_GRACE_MAX_S
    lost_timeout_s: float = DEFAULT_LOST_TIMEOUT_S
    stability_window_s: float = DEFAULT_STABILITY_WINDOW_S
    reconcile_interval_s: float = DEFAULT_INTERVAL_S
    drain_idle_timeout_s: float = DEFAULT_DRAIN_IDLE_TIMEOUT_S


class Role(StrEnum):
    STANDBY = "standby"
    LEADER = "leader"
    STOPPED = "stopped"


class Outcome(StrEnum):
    STOPPED = "stopped"
    """Asked to stop (a signal); leadership, if held, was handed back."""
    DEPOSED = "deposed"
    """Another server leads now, or may: this one stopped leading."""


class AgentChannel(CommandChannel, Protocol):
    """What a term needs of its agent hub: listen, send commands, close connections."""

    async def start(self, host: str, port: int) -> int: ...

    async def stop(self) -> None: ...

    async def enforce_revocations(self) -> int: ...

    def connected_nodes(self) -> list[str]: ...

    def connections_opening(self) -> int: ...

    def handshakes_refused(self) -> int: ...

    def certificates_refused(self) -> int: ...

    def connected_elsewhere(self) -> int: ...

    def earliest_certificate_end(self) -> datetime | None: ...


RevocationCheck = Callable[[PresentedCertificate], str | None]


@dataclass(frozen=True)
class LeaderWiring:
    """The adapters a term runs with, built by the composition root (``app.bootstrap``):
    ``hub(handler, epoch, revocations)`` an agent hub for the term, ``appends(position)``
    every event appended after ``position`` (it wakes the reconciler), ``in_flight`` what
    gateways report open on each replica."""

    hub: Callable[[ReportHandler, int, RevocationCheck], AgentChannel]
    appends: Callable[[int], AsyncIterator[Recorded]]
    in_flight: InFlightSource | None = None


class Leader:
    """One leadership term: the hub, the fleet view and the reconciler, all with ``epoch``."""

    def __init__(
        self,
        store: EventStore,
        config: ControlPlaneConfig,
        epoch: int,
        wiring: LeaderWiring,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._store = store
        self._config = config
        self.epoch = epoch
        self._wiring = wiring
        self._clock = clock
        self._deposed = asyncio.Event()
        self._deposed_reason = ""
        self._tasks: list[asyncio.Task[None]] = []
        recorder = ReportRecorder(store, epoch=epoch, on_fenced=self._depose)
        self.tracker = LiveView(recorder, model_of=self._model_of, clock=clock)
        self.hub = wiring.hub(self.tracker, epoch, self._revoked)
        self.reconciler: Reconciler | None = None

    async def start(self) -> int:
        """Catch up with the log, listen for agents and start reconciling; returns the
        agent port."""
        await self._caught_up()
        settings = Settings(
            epoch=self.epoch,
            started_at=self._clock(),
            adoption_grace_s=self._config.adoption_grace_s,
            adoption_quiet_s=self._config.adoption_quiet_s,
            adoption_grace_max_s=self._config.adoption_grace_max_s,
            lost_timeout_s=self._config.lost_timeout_s,
            stability_window_s=self._config.stability_window_s,
            drain_idle_timeout_s=self._config.drain_idle_timeout_s,
        )
        reconciler = Reconciler(
            self._store,
            self.hub,
            self.tracker,
            settings,
            interval_s=self._config.reconcile_interval_s,
            clock=self._clock,
            in_flight=self._wiring.in_flight,
            connections_opening=self.hub.connections_opening,
        )
        self.reconciler = reconciler
        port = await self.hub.start(self._config.agent_host, self._config.agent_port)
        self._tasks = [
            asyncio.create_task(self._reconcile(reconciler), name="reconciler"),
            asyncio.create_task(self._wake_on_appends(reconciler), name="reconciler-wake"),
        ]
        return port

    async def _caught_up(self) -> None:
        """Catch up, trying again for a moment if the database cannot be reached: a server
        elected just after a failover may find its pooled connections broken (the pool
        opens new ones, to the new primary, once a broken one was seen)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_RETRY_S
        while True:
            try:
                await self._store.catch_up()
                return
            except StoreUnavailable as exc:
                if loop.time() >= deadline:
                    raise
                log.warning("leader_catch_up_failed", error=str(exc), detail="trying again")
                await asyncio.sleep(START_RETRY_INTERVAL_S)

    async def deposed(self) -> str:
        """Wait until an append of this term was fenced; returns why."""
        await self._deposed.wait()
        return self._deposed_reason

    async def stop(self) -> None:
        """Stop reconciling, then close every agent connection (their disconnects are
        recorded while this term may still write)."""
        for task in self._tasks:
            await _cancel(task)
        self._tasks = []
        await self.hub.stop()

    def _depose(self, reason: str) -> None:
        if not self._deposed.is_set():
            self._deposed_reason = reason
            self._deposed.set()

    def _revoked(self, certificate: PresentedCertificate) -> str | None:
        return revocation_refusal(self._store.state.revocations, certificate)

    def _model_of(self, replica_id: str) -> str | None:
        replica = self._store.state.replicas.get(replica_id)
        return replica.model if replica is not None else None

    async def _reconcile(self, reconciler: Reconciler) -> None:
        try:
            await reconciler.run()
        except FencedError as exc:
            self._depose(str(exc))

    async def _wake_on_appends(self, reconciler: Reconciler) -> None:
        async for recorded in self._wiring.appends(self._store.state.position):
            reconciler.wake()
            if isinstance(recorded.event, CertificateRevoked):
                await self._enforce_revocations()

    async def _enforce_revocations(self) -> None:
        """Whoever recorded a revocation (any server's admin API), the connections using the
        certificate are this leader's: close them as soon as the fold has it."""
        while True:
            try:
                await self._store.catch_up()
                break
            except StoreError as exc:
                log.warning(
                    "revocations_not_enforced",
                    error=str(exc),
                    detail="the log is unreadable; trying again",
                )
                await asyncio.sleep(REVOCATION_RETRY_S)
        closed = await self.hub.enforce_revocations()
        log.info("revocations_enforced", connections_closed=closed)


class Election(Protocol):
    """Leadership: ``app.services.leader.LeaderElection``."""

    async def acquire(self) -> int: ...

    async def lost(self) -> str: ...

    async def close(self) -> None: ...


class ControlPlane:
    def __init__(
        self,
        store: EventStore,
        config: ControlPlaneConfig,
        wiring: LeaderWiring,
        election: Election,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._store = store
        self._config = config
        self._wiring = wiring
        self._election = election
        self._clock = clock
        self.role = Role.STANDBY
        self.leader: Leader | None = None

    async def run(self, stop: asyncio.Event) -> Outcome:
        """Lead when elected, until ``stop`` is set or leadership is lost."""
        log.info("standing_by", server_id=self._config.server_id)
        try:
            acquiring = asyncio.ensure_future(self._election.acquire())
            await _until_first(acquiring, stop.wait())
            if not _finished(acquiring):
                return Outcome.STOPPED
            return await self._lead(acquiring.result(), stop)
        finally:
            self.role = Role.STOPPED
            await self._election.close()

    async def _lead(self, epoch: int, stop: asyncio.Event) -> Outcome:
        leader = Leader(self._store, self._config, epoch, self._wiring, clock=self._clock)
        self.leader = leader
        try:
            port = await leader.start()
            self.role = Role.LEADER
            log.info("leading", epoch=epoch, agent_port=port, server_id=self._config.server_id)
            lost = asyncio.ensure_future(self._election.lost())
            deposed = asyncio.ensure_future(leader.deposed())
            await _until_first(lost, deposed, stop.wait())
            for ended in (lost, deposed):
                if _finished(ended):
                    log.error(
                        "leading_stopped",
                        detail="leadership lost: stopping the agent hub and the reconciler",
                        epoch=epoch,
                        reason=ended.result(),
                    )
                    return Outcome.DEPOSED
            return Outcome.STOPPED
        finally:
            await leader.stop()


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it to end. The cancellation is repeated while it runs:
    on Python 3.11 ``asyncio.wait_for`` (``Subscription`` waits with it) swallows one that
    arrives just as what it waits for is done."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_RETRY_S)
    if not task.cancelled() and task.exception() is not None:
        log.error("leader_task_failed", task=task.get_name(), error=str(task.exception()))


async def _until_first(*awaitables: Awaitable[object]) -> None:
    """Wait until one of ``awaitables`` finishes; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _finished(task: asyncio.Future[T]) -> bool:
    """Done by itself (with a result or an error), not cancelled."""
    return task.done() and not task.cancelled()
