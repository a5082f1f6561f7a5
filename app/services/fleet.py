"""What agents say, turned into events: convert, decide against the log, append.

The agent hub hands every observation of its sessions to ``FleetService.handle``. The
wire messages are converted to the domain's inputs here, at the edge; ``app.domain.fleet``
decides; the events are appended with the agent as the actor.

Observations about one node are handled one at a time, in the order they arrive, so a
node's events reach the log in the order its agent caused them (a disconnect can never
overtake the connect before it). Appends check the version of every stream they write;
when another writer moved one first, the decision is made again on the new state.

GPU health goes through each node's ``FlapGuard`` first: a GPU that flaps is held
unhealthy (one event) instead of reaching the log with every flip, and released on a later
heartbeat once it has been stable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import assert_never

import msgspec
import structlog

from app.domain import fleet
from app.domain.envelope import Meta
from app.domain.events import GpuInfo, event_type
from app.domain.gpu_flaps import FlapGuard, FlapPolicy
from app.domain.state import ClusterState, ShardPhase
from app.fleet.messages import GpuHealthChange, GpuReport, Hello, ShardStatus
from app.fleet.session import (
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    CommandCompleted,
    ConnectionRefused,
    IdentityMismatch,
    Observation,
    ShardStatusReported,
)
from app.store.errors import ConcurrencyError
from app.store.interface import AppendRequest, EventStore, NewEvent

HUB_ACTOR = "agent-hub"
"""The actor of events about refused connections: what a refused connection says is not
taken as its node's word."""
MAX_ATTEMPTS = 5

Decide = Callable[[ClusterState], fleet.Decision]

log = structlog.get_logger(__name__)


def agent_actor(node_id: str) -> str:
    return f"agent:{node_id}"


class FleetService:
    def __init__(
        self,
        store: EventStore,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        epoch: int | None = None,
        flap_policy: FlapPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``epoch``: the leader epoch of this control plane, carried in every append so a
        deposed leader's agent events are refused like its own (``FencedError``)."""
        self._store = store
        self._max_attempts = max_attempts
        self._epoch = epoch
        self._flap_policy = flap_policy or FlapPolicy()
        self._clock = clock
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._flaps: dict[str, FlapGuard] = {}

    async def handle(
        self, node_id: str, observation: Observation, *, replaced_previous: bool = False
    ) -> None:
        """Record what ``observation`` changes. ``replaced_previous`` says that the hello
        came on a connection that took over from an older one for the same node.

        Raises the store's errors (``ConcurrencyError`` after ``max_attempts`` lost races,
        ``FencedError`` once another leader took over, ``StoreError`` when the database
        fails); nothing was written for this observation then.
        """
        decide = self._decision_for(observation, replaced_previous)
        if decide is None:
            return
        identified = not isinstance(observation, IdentityMismatch | ConnectionRefused)
        actor = agent_actor(node_id) if identified else HUB_ACTOR
        # No await before the lock is taken: observations queue in the order they came.
        async with self._lock_for(node_id):
            await self._decide_and_append(decide, actor)

    def _lock_for(self, node_id: str) -> asyncio.Lock:
        return self._node_locks.setdefault(node_id, asyncio.Lock())

    async def _decide_and_append(self, decide: Decide, actor: str) -> None:
        # The usual heartbeat changes nothing: then there is nothing to load either.
        for attempt in range(1, self._max_attempts + 1):
            # Decided on the store's fold and appended with the versions of that fold: no
            # read before the write. If another writer moved a stream meanwhile, the store
            # refuses the append, catches up, and we decide again.
            decision = decide(self._store.state)
            if not decision:
                return
            versions = {s: self._store.known_version(s) for s in _streams(decision)}
            try:
                await self._store.append_many(
                    _requests(decision, versions), Meta(actor=actor, epoch=self._epoch)
                )
            except ConcurrencyError as exc:
                if attempt == self._max_attempts:
                    raise
                log.info("fleet decision lost a race", stream=exc.stream, attempt=attempt)
                await self._store.catch_up()
                continue
            log.info("fleet events recorded", actor=actor, events=_types(decision))
            return
        if decision:
            log.warning("fleet decision dropped", actor=actor, events=_types(decision))

    def _decision_for(self, observation: Observation, replaced_previous: bool) -> Decide | None:
        match observation:
            case AgentHello(hello=hello, remote_address=remote, certificate_serial=serial):
                inventory = self._debounced(_inventory(hello, remote, serial))
                return lambda state: fleet.agent_connected(
                    state, inventory, replaced_previous=replaced_previous
                )
            case AgentHeartbeat(node_id=node_id, heartbeat=heartbeat):
                guard, now = self._guard(node_id), self._clock()
                reported = [_gpu_health(change) for change in heartbeat.gpu_changes]
                changes = guard.observe(reported, now) + guard.release(now)
                if not changes:
                    return None
                return lambda state: fleet.gpu_health_reported(state, node_id, changes)
            case ShardStatusReported(node_id=node_id, status=status):
                report = _shard_report(status)
                return lambda state: fleet.shard_reported(state, node_id, report)
            case AgentGone(node_id=node_id, reason=reason):
                return lambda state: fleet.agent_gone(state, node_id, reason)
            case IdentityMismatch():
                claim = fleet.IdentityClaim(
                    claimed_node_id=observation.claimed_node_id,
                    certificate_subject=observation.certificate_subject,
                    remote_address=observation.remote_address,
                    reason=observation.reason,
                    suppressed=observation.suppressed,
                )
                return lambda _: fleet.identity_rejected(claim)
            case ConnectionRefused():
                refusal = fleet.Refusal(
                    node_id=observation.node_id,
                    remote_address=observation.remote_address,
                    certificate_serial=observation.certificate_serial,
                    reason=observation.reason,
                    suppressed=observation.suppressed,
                )
                return lambda _: fleet.node_refused(refusal)
            case CommandCompleted(node_id=node_id, result=result):
                log.info(
                    "agent command completed",
                    node_id=node_id,
                    command_id=result.command_id,
                    ok=result.ok,
                    error=result.error,
                )
                return None
            case _:
                assert_never(observation)

    def _guard(self, node_id: str) -> FlapGuard:
        return self._flaps.setdefault(node_id, FlapGuard(self._flap_policy))

    def _debounced(self, inventory: fleet.AgentInventory) -> fleet.AgentInventory:
        """The hello's GPUs as the log should see them: a flapping GPU stays held unhealthy,
        however often its agent reconnects."""
        guard = self._guard(inventory.node_id)
        reported = [
            fleet.GpuHealth(
                index=g.index, uuid=g.uuid, healthy=g.healthy, reason=g.unhealthy_reason
            )
            for g in inventory.gpus
        ]
        guard.observe(reported, self._clock())
        held = {health.index: guard.health(health) for health in reported}
        gpus = tuple(
            msgspec.structs.replace(
                gpu, healthy=held[gpu.index].healthy, unhealthy_reason=held[gpu.index].reason
            )
            for gpu in inventory.gpus
        )
        return msgspec.structs.replace(inventory, gpus=gpus)


def _types(decision: fleet.Decision) -> list[str]:
    return [event_type(event) for _, event in decision]


def _streams(decision: fleet.Decision) -> set[str]:
    return {stream for stream, _ in decision}


def _requests(decision: fleet.Decision, versions: dict[str, int]) -> list[AppendRequest]:
    """One request per stream, streams in the order the decision first names them."""
    by_stream: dict[str, list[NewEvent]] = {}
    for stream, event in decision:
        by_stream.setdefault(stream, []).append(NewEvent(event))
    return [AppendRequest(stream, versions[stream], events) for stream, events in by_stream.items()]


# -- wire to domain ----------------------------------------------------------------------


def _inventory(hello: Hello, remote_address: str, serial: str) -> fleet.AgentInventory:
    return fleet.AgentInventory(
        node_id=hello.node_id,
        address=hello.address,
        remote_address=remote_address,
        labels=dict(hello.labels),
        gpus=tuple(_gpu_info(gpu) for gpu in hello.gpus),
        port_range=hello.port_range,
        agent_version=hello.agent_version,
        certificate_serial=serial,
    )


def _gpu_info(gpu: GpuReport) -> GpuInfo:
    return GpuInfo(
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        memory_total_mib=gpu.memory_total_mib,
        memory_used_mib=gpu.memory_used_mib,
        healthy=gpu.healthy,
        unhealthy_reason=gpu.unhealthy_reason,
    )


def _gpu_health(change: GpuHealthChange) -> fleet.GpuHealth:
    return fleet.GpuHealth(
        index=change.index,
        uuid=change.uuid,
        healthy=change.healthy,
        reason=change.reason,
        xid=change.xid,
    )


def _shard_report(status: ShardStatus) -> fleet.ShardPhaseReport:
    return fleet.ShardPhaseReport(
        replica_id=status.replica_id,
        shard_index=status.shard_index,
        phase=_PHASES[status.state],
        pid=status.pid,
        error=status.error,
        exit_code=status.exit_code,
        log_tail=status.log_tail,
    )


_PHASES: dict[str, fleet.ReportedPhase] = {
    "starting": ShardPhase.STARTING,
    "ready": ShardPhase.READY,
    "failed": ShardPhase.FAILED,
    "stopped": ShardPhase.STOPPED,
}
