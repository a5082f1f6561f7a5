"""Domain events: frozen, past-tense facts about the cluster.

Every event is a tagged msgspec struct; the tag (``type``) is the snake_case class name
and is what the store writes in the ``type`` column. ``schema_version`` says which shape
of the payload a class reads; older payloads are upcast on read (see
``app.store.codec``), so a stored event stays readable forever.

Streams: ``model-<name>``, ``node-<id>``, ``replica-<id>``, ``key-<id>``, and
``certificate-<serial>`` for a certificate revoked by its serial. The helpers at
the bottom name them, so nobody formats a stream name by hand.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, ClassVar, assert_never

import msgspec

from app.domain.model_spec import ModelSpec
from app.domain.revisions import FIRST_REVISION, SpecChange


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=_snake):
    """Base of every event. Subclasses raise ``schema_version`` when their shape changes."""

    schema_version: ClassVar[int] = 1


# -- value types carried by events -------------------------------------------------------


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int = 0
    healthy: bool = True
    unhealthy_reason: str | None = None


class ShardPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where one shard of a replica runs: the control plane chose the node, GPUs and port."""

    index: int
    node_id: str
    gpus: tuple[int, ...]
    port: int


# -- models ------------------------------------------------------------------------------


class ModelDeclared(Event, frozen=True, kw_only=True):
    """``revision``: the model's revision from this declaration on (see
    ``app.domain.revisions``); ``changes``: what made it a new revision, empty when it is
    none (the first declaration, or a change that takes effect at once). Both are absent
    from older payloads, which read as revision 1 with no changes."""

    model: str
    spec: ModelSpec
    revision: int = FIRST_REVISION
    changes: tuple[SpecChange, ...] = ()


class ScaleInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the autoscaler saw when it changed a model's replica count: the demand (requests
    in flight on the model's replicas plus those held queued for it, over every gateway
    that reported), the load one replica should carry and where that came from, and the
    window figures that decided."""

    demand: float
    per_replica: float
    per_replica_from: str
    up_window_mean: float | None = None
    down_window_max: float | None = None
    samples: int = 0
    down_wait_s: float | None = None
    """For a scale-down: the seconds of lower demand it waited (``down_window_s``, or the
    share of it that ``down_window_min_share`` lets a deeper drop wait)."""
    down_wait_max: float | None = None
    """The highest up-window mean over those ``down_wait_s``: what the new count carries."""


class ModelScaled(Event, frozen=True, kw_only=True):
    """``reason`` and ``inputs``: why the autoscaler chose this count (absent when an
    operator scaled)."""

    model: str
    replicas: int
    previous: int
    reason: str = ""
    inputs: ScaleInputs | None = None


class ModelRemoved(Event, frozen=True, kw_only=True):
    model: str


class ModelTuned(Event, frozen=True, kw_only=True):
    """Routing settings measured by bench; ``replica_id`` set when tuned for one replica."""

    model: str
    replica_id: str | None = None
    weight: float
    target_waiting: int
    kv_ceiling: float
    summary: dict[str, Any] = {}


class ModelUnplaceable(Event, frozen=True, kw_only=True):
    """Recorded once per episode of "cannot place" (again when the reason changes), so the
    log says why a model is below its count; a replica of the model placed ends the episode,
    and the same reason after it is recorded again."""

    model: str
    reason: str
    missing_replicas: int = 1


# -- rollouts (on the model's stream; the rollout's id is their correlation id) ---------


class RolloutStarted(Event, frozen=True, kw_only=True):
    """A declaration made ``revision`` the model's: its replicas of ``from_revision`` are
    replaced step by step, by the policy in its spec."""

    model: str
    rollout_id: str
    revision: int
    from_revision: int
    undoes: str | None = None
    """The rollout an undo after success started this one to undo (its revision's spec is
    the one before that rollout); None for one a declaration started, and in events recorded
    before undos said so."""


class RolloutStepStarted(Event, frozen=True, kw_only=True):
    """Step ``step`` (from 0) begins: ``replicas`` of the new revision are to serve (the
    model's desired count when the step says all), sent ``traffic`` of the model's requests
    (None: their share by weight), held ``hold_s`` before its verdict."""

    model: str
    rollout_id: str
    step: int
    replicas: int
    traffic: float | None = None
    hold_s: float = 0.0


class RolloutHolding(Event, frozen=True, kw_only=True):
    """The step's replicas all serve: its hold begins."""

    model: str
    rollout_id: str
    step: int
    hold_s: float


class JudgedFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateways measured of one side of a verdict, over their window."""

    requests: int
    errors: int
    error_rate: float | None = None
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    latency_p95_ms: float | None = None
    gateways: int = 0
    window_s: float = 0.0
    ttft_samples: int = 0
    tpot_samples: int = 0
    latency_samples: int = 0
    """The samples behind each p95 (0 in verdicts recorded before they were kept): a p95
    is judged only on ``min_latency_samples`` of them on both sides."""
    abandoned: int = 0
    """Requests whose clients left before any of the answer came, counted in ``requests``
    and ``errors`` as the verdict judged them (0 in verdicts recorded before)."""


class RolloutHoldEjectionSeen(Event, frozen=True, kw_only=True):
    """During the hold of step ``step``, ``gateways`` live gateways at once kept the model's
    replica ``replica_id`` out of rotation for failing requests in a row: more than were
    recorded ejecting it earlier in this hold. Recorded once per rise, never per pass; the
    step's verdict counts it against its side even if it is back in rotation by then."""

    model: str
    rollout_id: str
    step: int
    replica_id: str
    gateways: int


class RolloutVerdict(Event, frozen=True, kw_only=True):
    """How a step's hold was judged: ``promote``, ``roll_back``, or ``inconclusive`` (too
    few requests or latency samples on one side, or replicas of both revisions ejected:
    the rollout pauses for an operator). ``canary``: the new
    revision's figures; ``stable``: those of the model's other replicas."""

    model: str
    rollout_id: str
    step: int
    verdict: str
    reason: str
    canary: JudgedFigures | None = None
    stable: JudgedFigures | None = None


class RolloutPaused(Event, frozen=True, kw_only=True):
    model: str
    rollout_id: str
    reason: str


class RolloutResumed(Event, frozen=True, kw_only=True):
    model: str
    rollout_id: str


class RolloutRolledBack(Event, frozen=True, kw_only=True):
    """The model is at ``to_revision`` again, with ``spec``; its replicas of the rolled
    back revision are replaced by that one."""

    model: str
    rollout_id: str
    reason: str
    to_revision: int
    spec: ModelSpec


class RolloutFinished(Event, frozen=True, kw_only=True):
    """``succeeded``: every replica runs the new revision; otherwise the rollout was rolled
    back (and every replica runs the old one again), or cannot go on (``outcome``)."""

    model: str
    rollout_id: str
    succeeded: bool
    outcome: str


# -- nodes -------------------------------------------------------------------------------


class NodeRegistered(Event, frozen=True, kw_only=True):
    node_id: str
    address: str
    labels: dict[str, str] = {}
    gpus: tuple[GpuInfo, ...] = ()
    agent_version: str = ""
    port_range: tuple[int, int] = (20000, 20999)


class NodeConnected(Event, frozen=True, kw_only=True):
    """An agent said hello; its inventory replaces what was known of the node."""

    node_id: str
    address: str
    remote_address: str = ""
    labels: dict[str, str] = {}
    gpus: tuple[GpuInfo, ...] = ()
    agent_version: str = ""
    port_range: tuple[int, int] = (20000, 20999)
    replaced_previous: bool = False
    certificate_serial: str = ""
    """The serial of the certificate the agent connected with (absent from older payloads)."""


class NodeDisconnected(Event, frozen=True, kw_only=True):
    node_id: str
    reason: str


class NodeLost(Event, frozen=True, kw_only=True):
    node_id: str
    disconnected_for_s: float


class NodeCordoned(Event, frozen=True, kw_only=True):
    node_id: str
    reason: str = ""


class NodeUncordoned(Event, frozen=True, kw_only=True):
    node_id: str


class NodeDrainRequested(Event, frozen=True, kw_only=True):
    node_id: str
    drain_id: str
    grace_s: float


class NodeForgotten(Event, frozen=True, kw_only=True):
    """An operator retired the node for good (the actor of this event): the state keeps
    nothing of it, and an agent that connects under its id later is registered anew.
    Recorded only while it was not connected, with no replica not ended on it, and no
    drain of it under way (``app.domain.node_forgetting``)."""

    node_id: str
    reason: str


class NodeDrainCancelled(Event, frozen=True, kw_only=True):
    """An operator called the node's drain off (the actor of this event): the reconciler
    calls off each of its moves under way and finishes the drain as cancelled. The node
    stays cordoned."""

    node_id: str
    drain_id: str


class NodeDrainFinished(Event, frozen=True, kw_only=True):
    node_id: str
    drain_id: str
    outcome: str
    succeeded: bool | None = None
    """Whether every replica that served on the node moved or was not needed (stopped with
    its model at its count without it); None in events recorded before drains said so,
    whose ``outcome`` is exactly ``every replica moved`` when they succeeded."""


class GpuMarkedUnhealthy(Event, frozen=True, kw_only=True):
    node_id: str
    gpu_index: int
    gpu_uuid: str = ""
    reason: str
    xid: int | None = None


class GpuRecovered(Event, frozen=True, kw_only=True):
    node_id: str
    gpu_index: int
    gpu_uuid: str = ""


class GpuCordoned(Event, frozen=True, kw_only=True):
    """An operator keeps new shards off one GPU of the node (the actor of this event says
    who): a shard already on it keeps running. ``gpu_uuid``: the UUID of the GPU listed
    under ``gpu_index`` then, so the cordon stays with that GPU if it is listed under
    another index later (``app.domain.gpu_identity``)."""

    node_id: str
    gpu_index: int
    gpu_uuid: str = ""
    reason: str = ""


class GpuUncordoned(Event, frozen=True, kw_only=True):
    node_id: str
    gpu_index: int
    gpu_uuid: str = ""


class IdentityRejected(Event, frozen=True, kw_only=True):
    """A connection whose certificate did not match the node it claimed, or was revoked.
    Changes no state. ``suppressed``: refusals like this one since the last recorded, which
    were not recorded one by one."""

    claimed_node_id: str
    certificate_subject: str
    remote_address: str
    reason: str
    suppressed: int = 0


class NodeRefused(Event, frozen=True, kw_only=True):
    """The hub refused or cut off a connection that proved its node: its hello claimed what
    the node cannot vouch for (an address, an impossible inventory), or it sent more than
    the channel allows. Changes no state; ``suppressed`` as for ``IdentityRejected``."""

    node_id: str
    remote_address: str
    certificate_serial: str = ""
    reason: str
    suppressed: int = 0


class CertificateRevoked(Event, frozen=True, kw_only=True):
    """A certificate may no longer connect: the one with ``serial``, or, with ``node_id``
    alone, every certificate issued to that node until the revocation was recorded."""

    serial: str | None = None
    node_id: str | None = None
    reason: str


class StrayStopped(Event, frozen=True, kw_only=True):
    """A shard nobody asked for was stopped; on the node's stream since its replica may be
    unknown to the log."""

    node_id: str
    replica_id: str
    shard_index: int
    model: str
    port: int
    pid: int | None = None
    rule: str


# -- replicas ----------------------------------------------------------------------------


class ReplicaPlaced(Event, frozen=True, kw_only=True):
    replica_id: str
    model: str
    number: int
    shards: tuple[ShardPlacement, ...]
    reason: str = "scale up"
    replaces: str | None = None
    revision: int = FIRST_REVISION
    """The revision of its model it runs (absent from older payloads: revision 1)."""


class ShardStarting(Event, frozen=True, kw_only=True):
    replica_id: str
    shard_index: int
    node_id: str
    pid: int | None = None


class ShardReady(Event, frozen=True, kw_only=True):
    replica_id: str
    shard_index: int
    node_id: str


class ShardFailed(Event, frozen=True, kw_only=True):
    """v2: the engine log tail is a list of lines (v1 stored one string, ``log``).
    ``port_held_elsewhere``: its agent found a process that is not the engine listening on
    the shard's port. Stored only when true: a payload without it (every one from before
    the field, and every other failure) reads as ``UNSET``, which is false, so a failure
    for another reason is stored as it was before the field existed; ``false``, which a few
    payloads hold, reads as false too."""

    schema_version: ClassVar[int] = 2
    replica_id: str
    shard_index: int
    node_id: str
    error: str
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    port_held_elsewhere: bool | msgspec.UnsetType = msgspec.UNSET


class ShardStopped(Event, frozen=True, kw_only=True):
    """``log_tail``: the engine's last lines when it was stopped before it was ever ready
    (absent from older payloads, which read as empty). ``reason``: why its agent stopped it
    of its own accord (``agent shutting down``); None for a stop the control plane asked
    for, and in older payloads."""

    replica_id: str
    shard_index: int
    node_id: str
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    reason: str | None = None


class ReplicaServing(Event, frozen=True, kw_only=True):
    replica_id: str


class ReplicaFailed(Event, frozen=True, kw_only=True):
    replica_id: str
    reason: str


class ReplicaDrainStarted(Event, frozen=True, kw_only=True):
    replica_id: str
    drain_id: str
    reason: str = ""


class ReplicaDrainCancelled(Event, frozen=True, kw_only=True):
    """A move of the replica is called off (its rollout was rolled back and it runs the
    revision rolled back to): it serves and counts again as before."""

    replica_id: str
    drain_id: str
    reason: str


class ReplacementServing(Event, frozen=True, kw_only=True):
    replica_id: str
    replacement_id: str


class ReplicaStopping(Event, frozen=True, kw_only=True):
    """Taken out of routing; in-flight requests may finish within the stop grace."""

    replica_id: str
    reason: str
    surplus: bool = False
    """Stopped by the scale rule: its model has its desired count without it (a scale-down,
    or a moved replica whose replacement the count has no room for). False in events
    recorded before stops said so."""


class ReplicaStopped(Event, frozen=True, kw_only=True):
    replica_id: str


class ReplicaStartupTimedOut(Event, frozen=True, kw_only=True):
    replica_id: str
    timeout_s: float
    waited_s: float

    @property
    def reason(self) -> str:
        """How the timeout is told wherever it is (the replica's end, the model's history,
        the placement that replaces it): one wording, so an operator who greps for it
        finds every one."""
        return f"timed out starting after {self.waited_s:.0f}s (limit {self.timeout_s:.0f}s)"


class ReplicaAdopted(Event, frozen=True, kw_only=True):
    """A running shard reported by an agent was taken as this replica's; ``rule`` says why."""

    replica_id: str
    shard_index: int
    node_id: str
    port: int
    pid: int | None = None
    ready: bool = True
    rule: str


class ReplicaLost(Event, frozen=True, kw_only=True):
    replica_id: str
    reason: str


class EndedReplicasForgotten(Event, frozen=True, kw_only=True):
    """An operator (the actor of this event) forgot the model's replicas that ended at or
    before ``before``: the state and the ``replicas`` and ``shards`` tables keep none of
    them from here on (``app.domain.replica_retention``); the events about each stay in
    the log, so its history still answers. Replicas not ended are never forgotten, nor
    their numbers: the model's count of replicas created stays. On the model's stream.
    ``replicas``: how many of those the tables held when it was decided, as the operator
    was told."""

    model: str
    before: datetime
    replicas: int = 0


# -- API keys ----------------------------------------------------------------------------


SECRET_FIELDS = frozenset({"secret_hash"})
"""Fields of an event that stay in the log: no answer of the server shows them, so a hash
that could check guesses of a key is never handed to anyone who can read the history."""


class ApiKeyCreated(Event, frozen=True, kw_only=True):
    """``expires_at``: when the key stops working (in UTC), by the clock alone: no event
    marks it. Absent from older payloads, which read as keys that never expire."""

    key_id: str
    name: str
    prefix: str
    secret_hash: str
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    expires_at: datetime | None = None


class ApiKeyRevoked(Event, frozen=True, kw_only=True):
    """``name`` and ``prefix``: the key's, as its creation recorded them, so that its
    history names the key its holders know; empty in older payloads, which name only the
    id."""

    key_id: str
    name: str = ""
    prefix: str = ""


AnyEvent = (
    ModelDeclared
    | ModelScaled
    | ModelRemoved
    | ModelTuned
    | ModelUnplaceable
    | RolloutStarted
    | RolloutStepStarted
    | RolloutHolding
    | RolloutHoldEjectionSeen
    | RolloutVerdict
    | RolloutPaused
    | RolloutResumed
    | RolloutRolledBack
    | RolloutFinished
    | NodeRegistered
    | NodeConnected
    | NodeDisconnected
    | NodeLost
    | NodeCordoned
    | NodeUncordoned
    | NodeDrainRequested
    | NodeDrainCancelled
    | NodeDrainFinished
    | NodeForgotten
    | GpuMarkedUnhealthy
    | GpuRecovered
    | GpuCordoned
    | GpuUncordoned
    | IdentityRejected
    | NodeRefused
    | CertificateRevoked
    | StrayStopped
    | ReplicaPlaced
    | ShardStarting
    | ShardReady
    | ShardFailed
    | ShardStopped
    | ReplicaServing
    | ReplicaFailed
    | ReplicaDrainStarted
    | ReplicaDrainCancelled
    | ReplacementServing
    | ReplicaStopping
    | ReplicaStopped
    | ReplicaStartupTimedOut
    | ReplicaAdopted
    | ReplicaLost
    | EndedReplicasForgotten
    | ApiKeyCreated
    | ApiKeyRevoked
)

EVENT_TYPES: dict[str, type[Event]] = {_snake(cls.__name__): cls for cls in AnyEvent.__args__}


# -- what an event is about ----------------------------------------------------------------


class Subjects(msgspec.Struct, frozen=True, kw_only=True):
    """The entities an event is about, by id. The log files every event under its model,
    node and replica (the ``events`` table's columns of those names, which audits filter
    on), and the projection rewrites the rows of these entities (and of a replica's model)."""

    model: str | None = None
    node: str | None = None
    replica: str | None = None
    key: str | None = None
    certificate: str | None = None
    """The serial of a certificate an event revokes."""


def subjects(event: AnyEvent) -> Subjects:
    """What ``event`` is about. The most frequent events come first: a ``match`` tries its
    cases in order, and every appended event is asked this twice."""
    match event:
        case ShardStarting() | ShardReady() | ShardFailed() | ShardStopped() | ReplicaAdopted():
            return Subjects(replica=event.replica_id, node=event.node_id)
        case ReplicaPlaced():
            return Subjects(replica=event.replica_id, model=event.model)
        case (
            ReplicaServing()
            | ReplicaStopping()
            | ReplicaStopped()
            | ReplicaDrainStarted()
            | ReplicaDrainCancelled()
            | ReplacementServing()
            | ReplicaFailed()
            | ReplicaStartupTimedOut()
            | ReplicaLost()
        ):
            return Subjects(replica=event.replica_id)
        case (
            NodeConnected()
            | NodeDisconnected()
            | NodeRegistered()
            | NodeLost()
            | NodeCordoned()
            | NodeUncordoned()
            | NodeDrainRequested()
            | NodeDrainCancelled()
            | NodeDrainFinished()
            | NodeForgotten()
            | GpuMarkedUnhealthy()
            | GpuRecovered()
            | GpuCordoned()
            | GpuUncordoned()
            | NodeRefused()
        ):
            return Subjects(node=event.node_id)
        case StrayStopped():
            # On the node's stream, about a replica the log may not know (and its model).
            return Subjects(node=event.node_id, replica=event.replica_id, model=event.model)
        case IdentityRejected():
            return Subjects(node=event.claimed_node_id)
        case CertificateRevoked():
            return Subjects(node=event.node_id, certificate=event.serial)
        case (
            ModelDeclared()
            | ModelScaled()
            | ModelRemoved()
            | ModelUnplaceable()
            | RolloutStarted()
            | RolloutStepStarted()
            | RolloutHolding()
            | RolloutVerdict()
            | RolloutPaused()
            | RolloutResumed()
            | RolloutRolledBack()
            | RolloutFinished()
            | EndedReplicasForgotten()
        ):
            return Subjects(model=event.model)
        case ModelTuned() | RolloutHoldEjectionSeen():
            return Subjects(model=event.model, replica=event.replica_id)
        case ApiKeyCreated() | ApiKeyRevoked():
            return Subjects(key=event.key_id)
        case _:
            assert_never(event)


def event_type(event: Event) -> str:
    """The ``type`` tag the store records for ``event``."""
    return type(event).__struct_config__.tag  # type: ignore[return-value]


# -- stream names ------------------------------------------------------------------------


MODEL_STREAM_PREFIX = "model-"


def model_stream(name: str) -> str:
    return f"{MODEL_STREAM_PREFIX}{name}"


def node_stream(node_id: str) -> str:
    return f"node-{node_id}"


def replica_stream(replica_id: str) -> str:
    return f"replica-{replica_id}"


def key_stream(key_id: str) -> str:
    return f"key-{key_id}"


def certificate_stream(serial: str) -> str:
    return f"certificate-{serial}"


def replica_id_for(model: str, number: int) -> str:
    """Replica ids are ``<model>-<n>``; ``n`` comes from the model's history, never reused."""
    return f"{model}-{number}"
