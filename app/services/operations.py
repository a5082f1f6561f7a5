"""What operators ask of the cluster: load the log's state, decide, append.

Every change is appended with the operator as the actor and a correlation id (the drain's
id for drains, the rollout's for a pause, resume or undo of a rollout under way, else the
request's id), and only if the stream it writes is still at the version the decision was
made on: of two operators changing one thing at once, the second gets a
``ConcurrencyError`` (409) instead of silently overwriting the first.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from app.clock import utc_now
from app.domain import drain_cancel, node_forgetting, replica_retention, revocations, tuning
from app.domain import keys as key_decisions
from app.domain import model_operations as model_decisions
from app.domain import node_operations as node_decisions
from app.domain import rollout_operations as rollouts
from app.domain.apply_preview import ApplyPreview, preview_apply
from app.domain.drain_progress import DrainProgress, current_revisions, drain_progress
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    key_stream,
    model_stream,
    node_stream,
    replica_stream,
    subjects,
)
from app.domain.idempotency import IdempotencyKey, KeyShownOnce
from app.domain.model_spec import AutoscalePolicy, ModelSpec, RoutingSettings
from app.domain.model_status import ModelStatus, model_status
from app.domain.operation_results import Change, InvalidOperation, OperationError
from app.domain.placement import Explanation
from app.domain.replica_listing import ListingKey, ReplicaPage, UnknownPageStart, listing_key
from app.domain.reports import NodeReport
from app.domain.state import (
    ApiKey,
    CertificateRevocation,
    ClusterState,
    Model,
    Replica,
    ReplicaFilter,
    ReplicaPhase,
    revocation_key,
)
from app.services.conflicts import conflict_met
from app.services.replayed_changes import (
    AlreadyCarriedOut,
    carried_out_before,
    check_same_request,
    created_key,
    drain_of,
    keyed_events,
    revoked_key,
)
from app.store.errors import ConcurrencyError
from app.store.interface import AppendRequest, EventStore

ChangeT = TypeVar("ChangeT", bound=Change)

DRAIN_EVENTS_SHOWN = 1000
"""A drain's progress shows its first event (the request) and its newest ones, this many in
all: a drain of any length answers at a bounded cost, and its end is among the newest."""
PREFIX_DRAWS = 8
"""Prefixes drawn before giving up: with 2**32 of them, a second draw is already rare."""
DRAIN_CANCEL_READS = 3
"""Reads of a drain's events a cancellation decides on before a refusal stands: the fold
moving on while they are read (another cancellation of it) makes them stale."""


def new_drain_id() -> str:
    return f"drain-{secrets.token_hex(4)}"


def new_request_id() -> str:
    return f"req-{secrets.token_hex(6)}"


@dataclass(frozen=True)
class Caller:
    """Who asked (the actor of what is recorded), the id of their request, and the
    idempotency key it came with, if any (``app.domain.idempotency``)."""

    actor: str
    request_id: str = field(default_factory=new_request_id)
    idempotency: IdempotencyKey | None = None


@dataclass(frozen=True)
class RolloutReport:
    status: rollouts.RolloutStatus
    model: Model
    """The model now: its revision is the one rolled back to once a rollout is."""
    replicas: list[Replica]
    """The model's replicas the fold holds (every active one)."""


@dataclass(frozen=True)
class NewKey:
    key: str
    """The whole key: returned once to whoever created it, stored and logged nowhere."""
    record: ApiKey


RunningSource = Callable[[], Mapping[str, NodeReport]]
"""What each connected node reports running now: the leader's live view; a server that is
not leading knows none (placement then goes by the log alone)."""


def nothing_running() -> Mapping[str, NodeReport]:
    return {}


class Operations:
    def __init__(
        self,
        store: EventStore,
        clock: Callable[[], datetime] = utc_now,
        running: RunningSource = nothing_running,
    ) -> None:
        self._store = store
        self._clock = clock
        self._running = running
        # Key names are unique among live keys, but each key is its own stream, so the
        # stream version cannot catch two creations of one name: this process makes them
        # one at a time (the second is refused as a repeat), and a creation is appended
        # only if no live key of its name came meanwhile from another control plane
        # (``keys.same_name_created_since``).
        self._key_creation = asyncio.Lock()

    def gpu_memory_used(self, node_id: str) -> Mapping[int, int]:
        """MiB in use on each GPU of the node, by index, as its heartbeats said it since its
        hello (the live view's, so a leader's only); a GPU not in it goes by the hello."""
        report = self._running().get(node_id)
        return report.gpu_memory_used_mib if report is not None else {}

    # -- changes: each returns whether anything was recorded, or the new drain's id --------

    async def apply_model(self, caller: Caller, spec: ModelSpec) -> bool:
        stream = model_stream(spec.name)
        return await self._record(caller, stream, lambda s: model_decisions.apply_model(s, spec))

    async def scale(self, caller: Caller, name: str, replicas: int) -> bool:
        stream = model_stream(name)
        return await self._record(
            caller, stream, lambda s: model_decisions.scale(s, name, replicas)
        )

    async def set_autoscale(
        self, caller: Caller, name: str, policy: AutoscalePolicy | None
    ) -> bool:
        """Autoscale the model with ``policy``, or stop (None)."""
        stream = model_stream(name)
        return await self._record(
            caller, stream, lambda s: model_decisions.set_autoscale(s, name, policy)
        )

    async def patch_autoscale(
        self, caller: Caller, name: str, fields: Mapping[str, float | int | None]
    ) -> bool:
        """Change only ``fields`` of the model's policy, merged with the policy the change
        is appended on (``model_decisions.patch_autoscale``)."""
        stream = model_stream(name)
        return await self._record(
            caller, stream, lambda s: model_decisions.patch_autoscale(s, name, fields)
        )

    async def remove(self, caller: Caller, name: str) -> bool:
        return await self._record(
            caller, model_stream(name), lambda s: model_decisions.remove(s, name)
        )

    async def cordon(self, caller: Caller, node_id: str, reason: str) -> bool:
        stream = node_stream(node_id)
        return await self._record(
            caller, stream, lambda s: node_decisions.cordon(s, node_id, reason)
        )

    async def uncordon(self, caller: Caller, node_id: str) -> bool:
        stream = node_stream(node_id)
        return await self._record(caller, stream, lambda s: node_decisions.uncordon(s, node_id))

    async def cordon_gpu(self, caller: Caller, node_id: str, gpu_index: int, reason: str) -> bool:
        return await self._record(
            caller,
            node_stream(node_id),
            lambda s: node_decisions.cordon_gpu(s, node_id, gpu_index, reason),
        )

    async def uncordon_gpu(self, caller: Caller, node_id: str, gpu_index: int) -> bool:
        return await self._record(
            caller,
            node_stream(node_id),
            lambda s: node_decisions.uncordon_gpu(s, node_id, gpu_index),
        )

    async def forget_node(
        self, caller: Caller, node_id: str, reason: str, *, revoke_certificates: bool = False
    ) -> bool:
        """Record that the node is gone for good (``node_forgetting``), after a revocation
        of its certificates with ``revoke_certificates``; refused if a replica was placed
        on it meanwhile."""
        return await self._record(
            caller,
            node_stream(node_id),
            lambda s: node_forgetting.forget(
                s, node_id, reason, revoke_certificates=revoke_certificates
            ),
            still_holds=node_forgetting.forget_overtaken,
        )

    async def forget_ended_replicas(
        self, caller: Caller, before: datetime | None = None, older_than_s: float | None = None
    ) -> replica_retention.Forgetting:
        """Forget the replicas that ended at or before ``before``, or more than
        ``older_than_s`` seconds ago (``replica_retention``): one event per model with any,
        appended at once, each on its model's stream whatever its version (nothing a
        model's other changes do makes it wrong). A request sent again with its idempotency
        key answers what the first forgot."""
        now = self._clock()
        before = replica_retention.cutoff_of(before, older_than_s, now)
        try:
            await self._carried_out_before(caller)
            held = await self._store.ended_replicas_by_model(before)
            changes = replica_retention.forget_ended(before, now, held)
            events = [e for change in changes for e in change.events]
            if not events:
                await self._carried_out_before(caller)
                return replica_retention.Forgetting(before=before)
            meta = _meta(caller, caller.request_id)
            keyed = keyed_events(caller.actor, caller.idempotency, events)
            requests = [
                AppendRequest(change.stream, None, [new])
                for change, new in zip(changes, keyed, strict=True)
            ]
            recorded = await self._store.append_many(requests, meta)
            _check_first(caller, meta, recorded)
        except AlreadyCarriedOut as done:
            first = await self._store.read_correlated(done.first.meta.correlation_id or "")
            return replica_retention.forgetting(before, (r.event for r in first))
        return replica_retention.forgetting(before, events)

    async def drain_node(
        self, caller: Caller, node_id: str, grace_s: float, *, require_room: bool = False
    ) -> node_decisions.NodeDrain:
        """The drain recorded (its id is the events' correlation id), with whether each
        replica on the node has somewhere to go, as decided on the state it was recorded on."""
        drain_id = new_drain_id()
        running = self._running()
        stream = node_stream(node_id)
        try:
            return await self._append(
                caller,
                stream,
                lambda s: node_decisions.drain_node(
                    s, node_id, drain_id, grace_s, require_room=require_room, running=running
                ),
                correlation_id=drain_id,
                still_holds=node_decisions.room_overtaken,
            )
        except AlreadyCarriedOut as done:
            # Without the room the first answer had: it was judged then, and is not now.
            return node_decisions.NodeDrain(stream=stream, drain_id=drain_of(done.first))

    async def drain_replica(self, caller: Caller, replica_id: str) -> str:
        drain_id = new_drain_id()
        try:
            await self._append(
                caller,
                replica_stream(replica_id),
                lambda s: node_decisions.drain_replica(s, replica_id, drain_id),
                correlation_id=drain_id,
                about_replica=replica_id,
            )
        except AlreadyCarriedOut as done:
            return drain_of(done.first)
        return drain_id

    async def cancel_drain(self, caller: Caller, drain_id: str) -> bool:
        """Call the drain off (``drain_cancel``); False when it was called off already.

        The drain's events are read before the fold it is decided on catches up, so an
        event of the drain recorded in between (another operator's cancellation of it, at
        the same moment) is in the fold and not in the events: the drain, no longer
        draining, would look as if it ended otherwise. A refusal decided on a fold past
        what the events were read after is decided again on the events read anew."""
        for _ in range(DRAIN_CANCEL_READS - 1):
            read_after = self._store.state.position
            try:
                return await self._cancel_on_events_read_now(caller, drain_id)
            except InvalidOperation:
                if self._store.state.position <= read_after:
                    raise
        return await self._cancel_on_events_read_now(caller, drain_id)

    async def _cancel_on_events_read_now(self, caller: Caller, drain_id: str) -> bool:
        events = await self._drain_events(drain_id)
        target = drain_cancel.drain_target(drain_id, events)
        return await self._record(
            caller,
            target.stream,
            lambda s: drain_cancel.cancel_drain(s, drain_id, events),
            correlation_id=drain_id,
            about_replica=target.replica_id,
        )

    async def pause_rollout(self, caller: Caller, name: str, reason: str) -> bool:
        return await self._steer_rollout(caller, name, lambda s: rollouts.pause(s, name, reason))

    async def resume_rollout(self, caller: Caller, name: str) -> bool:
        return await self._steer_rollout(caller, name, lambda s: rollouts.resume(s, name))

    async def undo_rollout(self, caller: Caller, name: str, rollout_id: str | None = None) -> bool:
        """Undo ``rollout_id`` if it is still the model's rollout; None: the model's rollout,
        unless an undo started it."""
        return await self._steer_rollout(caller, name, lambda s: rollouts.undo(s, name, rollout_id))

    async def _steer_rollout(
        self, caller: Caller, name: str, decision: Callable[[ClusterState], Change]
    ) -> bool:
        return await self._record(caller, model_stream(name), decision)

    async def tune(
        self,
        caller: Caller,
        name: str,
        replica_id: str | None,
        routing: RoutingSettings,
        summary: Mapping[str, Any],
        revision: int | None = None,
    ) -> bool:
        return await self._record(
            caller,
            model_stream(name),
            lambda s: tuning.tune(s, name, replica_id, routing, summary, revision),
            about_replica=replica_id,
        )

    async def create_key(
        self,
        caller: Caller,
        name: str,
        models: Sequence[str],
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: datetime | None = None,
        expires_in_s: float | None = None,
    ) -> NewKey:
        secret = secrets.token_urlsafe(32)
        async with self._key_creation:
            for _ in range(PREFIX_DRAWS):
                prefix = secrets.token_hex(4)
                key, key_id = key_decisions.format_key(prefix, secret), f"k-{prefix}"
                now = self._clock()
                creation = partial(
                    key_decisions.create,
                    name=name,
                    models=models,
                    rpm=rpm,
                    tpm=tpm,
                    key_id=key_id,
                    prefix=prefix,
                    secret_hash=key_decisions.hash_key(key),
                    now=now,
                    expires_at=expires_at,
                    expires_in_s=expires_in_s,
                )
                name_free = partial(key_decisions.same_name_created_since, now=now)
                try:
                    await self._append(caller, key_stream(key_id), creation, still_holds=name_free)
                except key_decisions.PrefixTaken:
                    continue
                except AlreadyCarriedOut as done:
                    raise KeyShownOnce(created_key(done.first)) from None
                return NewKey(key=key, record=(await self.current()).keys[key_id])
        raise key_decisions.PrefixTaken(f"no free key prefix in {PREFIX_DRAWS} draws")

    async def revoke_key(self, caller: Caller, prefix_or_name: str) -> tuple[bool, ApiKey]:
        """Whether anything was recorded (not when the key was revoked already), and the key."""
        key = await self.find_key(prefix_or_name)
        try:
            change = await self._append(
                caller, key_stream(key.id), lambda s: key_decisions.revoke(s, key.id)
            )
        except AlreadyCarriedOut as done:
            # The key the first request revoked: the name may name another one by now.
            return True, (await self.current()).keys[revoked_key(done.first)]
        return bool(change.events), (await self.current()).keys[key.id]

    async def revoke_certificate(
        self, caller: Caller, request: revocations.RevocationRequest
    ) -> tuple[bool, CertificateRevocation]:
        """Whether anything was recorded (not for a serial revoked already), and the
        revocation as the log now holds it."""
        request = revocations.checked(request)
        stream = revocations.revocation_stream(request)
        changed = await self._record(caller, stream, lambda s: revocations.revoke(s, request))
        key = revocation_key(request.serial, request.node_id)
        return changed, (await self.current()).revocations[key]

    # -- questions ---------------------------------------------------------------------

    async def list_revocations(self) -> list[CertificateRevocation]:
        return revocations.listed(await self.current())

    async def list_keys(
        self, *, after: str | None = None, limit: int | None = None
    ) -> list[ApiKey]:
        return key_decisions.listed(await self.current(), after=after, limit=limit)

    async def find_key(self, prefix_or_name: str) -> ApiKey:
        """The key with that id, prefix or name, as ``revoke_key`` finds it."""
        return key_decisions.find_key(await self._store.catch_up(), prefix_or_name, self._clock())

    def now(self) -> datetime:
        """The time by this service's clock: whether a key it lists has expired."""
        return self._clock()

    async def current(self) -> ClusterState:
        """The cluster as of the end of the log; later appends do not change this copy."""
        return (await self._store.catch_up()).copy()

    async def models(self, *, include_removed: bool = False) -> list[ModelStatus]:
        state, now = await self.current(), self._clock()
        return [
            model_status(state, name, now)
            for name, model in sorted(state.models.items())
            if include_removed or not model.removed
        ]

    async def model(self, name: str) -> ModelStatus:
        return model_status(await self.current(), name, self._clock())

    async def placement(self, name: str) -> Explanation:
        return model_decisions.placement_of(await self.current(), name, self._running())

    async def preview_model(self, spec: ModelSpec) -> ApplyPreview:
        """What ``apply_model`` would record now, decided the same way; nothing recorded."""
        return preview_apply(await self._store.catch_up(), spec)

    async def placement_dry_run(self, spec: ModelSpec) -> Explanation:
        return model_decisions.placement_dry_run(await self.current(), spec, self._running())

    async def rollout(self, name: str) -> RolloutReport:
        """Where the model's rollout under way (or its last one) stands."""
        state = await self.current()
        status = rollouts.rollout_status(state, name, self._clock())
        return RolloutReport(
            status=status,
            model=state.models[name],
            replicas=[r for r in state.replicas.values() if r.model == name],
        )

    async def rollout_id(self, name: str) -> str | None:
        """The id of the model's rollout under way, or of its last one; None without one."""
        rollout = model_decisions.find_model(await self._store.catch_up(), name).rollout
        return rollout.id if rollout is not None else None

    async def drain(self, drain_id: str) -> DrainProgress:
        events = await self._drain_events(drain_id)
        state = await self.current()
        for replica_id in sorted({i for e in events if (i := subjects(e.event).replica)}):
            await self._put_back(state, replica_id)
        return drain_progress(state, drain_id, events)

    async def _drain_events(self, drain_id: str) -> list[Recorded]:
        """The drain's first event (its request) and its newest ones."""
        first = await self._store.read_correlated(drain_id, 1)
        newest = await self._store.read_correlated(drain_id, DRAIN_EVENTS_SHOWN - 1, newest=True)
        return [*first, *(e for e in newest if first and e.position > first[0].position)]

    async def replicas(
        self,
        model: str | None = None,
        node_id: str | None = None,
        phase: ReplicaPhase | None = None,
        *,
        ended: bool = True,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Replica]:
        """Replicas of ``model``, with a shard on ``node_id``, in ``phase`` (each if given),
        ended ones too when ``ended``, those the fold forgot included, by model and number:
        those after the replica ``after`` (``UnknownPageStart`` when the log knows no such
        replica), at most ``limit``, when given."""
        state = await self.current()
        among = ReplicaFilter(model=model, node_id=node_id, phase=phase, ended=ended)
        page = ReplicaPage(after=await self._page_start(state, after), limit=limit)
        forgotten = await self._store.forgotten_replicas(state.replicas.keys(), among, page)
        return page.of([*filter(among.matches, state.replicas.values()), *forgotten])

    async def ended_left_out(
        self,
        model: str | None = None,
        node_id: str | None = None,
        phase: ReplicaPhase | None = None,
    ) -> bool:
        """Whether a replica of ``model``, with a shard on ``node_id``, in ``phase`` (each if
        given) has ended: what ``replicas(..., ended=False)`` leaves out, the replicas the
        fold forgot included. Asked of the store, which stops at the first it finds."""
        among = ReplicaFilter(model=model, node_id=node_id, phase=phase)
        return await self._store.any_ended_replica(among)

    async def _page_start(self, state: ClusterState, replica_id: str | None) -> ListingKey | None:
        """Where the replica ``replica_id`` sorts, the fold's or one it forgot."""
        if replica_id is None:
            return None
        replica = state.replicas.get(replica_id) or await self._forgotten(replica_id)
        if replica is None:
            raise UnknownPageStart(replica_id)
        return listing_key(replica)

    async def revisions(self, replicas: Sequence[Replica]) -> dict[str, int]:
        """The current revision of each model of ``replicas``."""
        return current_revisions(await self._store.catch_up(), replicas)

    async def replica(self, replica_id: str) -> Replica:
        """The replica as the fold has it, or as it had it before forgetting it."""
        state = await self.current()
        await self._put_back(state, replica_id)
        return node_decisions.find_replica(state, replica_id)

    async def _put_back(self, state: ClusterState, replica_id: str) -> None:
        """Put the replica back into ``state`` (a copy) if the fold forgot it: rebuilt from
        the events about it, exactly as the fold had it."""
        if replica_id in state.replicas:
            return
        replica = await self._forgotten(replica_id)
        if replica is not None:
            state.replicas[replica_id] = replica

    async def _forgotten(self, replica_id: str) -> Replica | None:
        """The replica as the fold had it before forgetting it, rebuilt from the events
        about it; None when the log has none."""
        events = await self._store.read_about_replica(replica_id)
        return node_decisions.replica_from_events(replica_id, events) if events else None

    # -- the shell -----------------------------------------------------------------------

    async def _record(
        self,
        caller: Caller,
        stream: str,
        decision: Callable[[ClusterState], Change],
        correlation_id: str | None = None,
        about_replica: str | None = None,
        still_holds: Callable[[Change, ClusterState], str | None] | None = None,
    ) -> bool:
        """Whether anything was recorded (see ``_append``); for a change sent again with
        its idempotency key, whether the first time recorded anything."""
        try:
            change = await self._append(
                caller, stream, decision, correlation_id, about_replica, still_holds
            )
        except AlreadyCarriedOut:
            return True
        return bool(change.events)

    async def _append(
        self,
        caller: Caller,
        stream: str,
        decision: Callable[[ClusterState], ChangeT],
        correlation_id: str | None = None,
        about_replica: str | None = None,
        still_holds: Callable[[ChangeT, ClusterState], str | None] | None = None,
    ) -> ChangeT:
        """The change decided and appended (nothing when it has no events). The events are
        correlated with what the decision says they are part of (a rollout), else with
        ``correlation_id``, else with the request. ``still_holds``: asked of the change and
        the log as it is appended on, for a decision another stream's change can overturn
        (``EventStore.append_many``). Raises ``AlreadyCarriedOut`` for a change the
        caller's idempotency key recorded before, without deciding it again."""
        await self._carried_out_before(caller)
        # Decided on the caught-up fold and appended with that fold's version of the
        # stream: the append succeeds only if no event came since.
        state = await self._store.catch_up()
        if about_replica is not None and about_replica not in state.replicas:
            # A replica the fold forgot has ended, and the decision refuses it as it did
            # before: with the same words, so it is put back into a copy to decide on.
            state = state.copy()
            await self._put_back(state, about_replica)
        try:
            change = decision(state)
        except OperationError:
            # The first request with the caller's key, sent at the same time, may have
            # recorded the change since it was looked for: this one is then that one.
            await self._carried_out_before(caller)
            raise
        version = self._store.known_version(stream)
        if change.stream != stream:
            raise RuntimeError(f"decision for {stream} wrote {change.stream}")
        if not change.events:
            await self._carried_out_before(caller)
            return change
        meta = _meta(caller, change.correlation_id or correlation_id or caller.request_id)
        request = AppendRequest(
            stream, version, keyed_events(caller.actor, caller.idempotency, change.events)
        )
        check = partial(still_holds, change) if still_holds is not None else None
        try:
            recorded = await self._store.append_many([request], meta, still_holds=check)
        except ConcurrencyError as exc:
            # Also the same key sent twice at once with changes of other lengths: what the
            # first did not record is refused, the stream having moved on.
            await self._carried_out_before(caller)
            raise await conflict_met(self._store, exc) from exc
        _check_first(caller, meta, recorded)
        return change

    async def _carried_out_before(self, caller: Caller) -> None:
        """Raises ``AlreadyCarriedOut`` when the caller's idempotency key recorded a change
        before, ``KeyReused`` when that change was another request."""
        if caller.idempotency is not None:
            await carried_out_before(self._store, caller.actor, caller.idempotency)


def _meta(caller: Caller, correlation_id: str) -> Meta:
    """What a change by ``caller`` is recorded with, correlated with ``correlation_id``."""
    key = caller.idempotency
    return Meta(
        actor=caller.actor,
        correlation_id=correlation_id,
        causation_id=caller.request_id,
        idempotency_key=key.key if key is not None else None,
        request_digest=key.request_digest if key is not None else None,
    )


def _check_first(caller: Caller, meta: Meta, recorded: Sequence[Recorded]) -> None:
    """Raises ``AlreadyCarriedOut`` when ``recorded`` are another request's events: the
    same key sent twice at once, the second finds the first's events in the log as it
    appends (their ids are the same), and the log keeps those."""
    key = caller.idempotency
    if key is None or not recorded:
        return
    first = recorded[0]
    check_same_request(key, first)
    if (first.meta.correlation_id, first.meta.causation_id) != (
        meta.correlation_id,
        meta.causation_id,
    ):
        raise AlreadyCarriedOut(first)
