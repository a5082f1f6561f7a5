"""The cluster as the log describes it: nodes, models, replicas with shards, API keys.

Entities are frozen; ``evolve`` replaces an entity when an event changes it. The maps in
``ClusterState`` are updated in place by ``evolve`` (see its docstring for why).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec

from app.domain.events import GpuInfo
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.revisions import FIRST_REVISION


class ReplicaPhase(StrEnum):
    PLACED = "placed"
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"


ACTIVE_PHASES = frozenset(
    {
        ReplicaPhase.PLACED,
        ReplicaPhase.STARTING,
        ReplicaPhase.SERVING,
        ReplicaPhase.DRAINING,
        ReplicaPhase.STOPPING,
    }
)


ENDED_PHASES = frozenset(ReplicaPhase) - ACTIVE_PHASES

UNASKED_ENDS = frozenset({ReplicaPhase.FAILED, ReplicaPhase.TIMED_OUT, ReplicaPhase.LOST})
"""Ends nobody asked for: the replica failed, timed out starting, or was lost."""

GPU_MOVE_PREFIX = "gpu-move-"
"""How the drain id of the reconciler's move of a replica off an unhealthy GPU begins
(``app.domain.gpu_moves``); an operator's drain's begins ``drain-``."""


def is_gpu_move(drain_id: str | None) -> bool:
    """Whether ``drain_id`` is a move off an unhealthy GPU."""
    return drain_id is not None and drain_id.startswith(GPU_MOVE_PREFIX)


NOT_SERVING_YET = frozenset({ReplicaPhase.PLACED, ReplicaPhase.STARTING})
"""Placed or starting: active, counting towards the desired count, serving nothing yet."""

COUNTING_PHASES = NOT_SERVING_YET | {ReplicaPhase.SERVING}
"""Placed, starting or serving: the replicas that count towards their model's desired
count, and towards a rollout's step (a draining or stopping one is on its way out)."""

ENDED_KEPT_PER_MODEL = 20
"""Ended replicas the fold keeps per model, the most recently ended; older ones are
forgotten (see ``Model.ended``).

Why a count and not a time: a count is read off the events alone (no clock, so a replay, a
fold from a snapshot and the live fold forget the same replicas at the same event), it
bounds the fold whatever the churn (a crash loop ends replicas as fast as backoff lets it),
and it costs one short tuple per model. Twenty is far more than ever end together in
practice, so an engine still running for a replica that just ended is stopped as planned,
not as a stray. A forgotten replica stays in the log and in the ``replicas`` and
``shards`` tables; the fold no longer decides anything with it (see docs/reconciler.md)."""

BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 600.0
STEADY_SERVING_S = 60.0
"""A replica that served this long before it failed is replaced at once: its crash (an
engine killed, a GPU fault) is no failure to start, and the model is not put in backoff.
One that fails sooner counts, so an engine that crashes soon after it serves, again and
again, is still held back."""
STRAYS_REMEMBERED = 64


def stray_key(replica_id: str, shard_index: int, pid: int | None) -> str:
    """What a node's ``stray_stops`` remember of a stray: its engine."""
    return f"{replica_id}/{shard_index}/{pid}"


def backoff_s(failures: int) -> float:
    """Seconds a model waits before placing again after ``failures`` failures in a row."""
    return float(min(BACKOFF_BASE_S * 2.0 ** max(failures - 1, 0), BACKOFF_CAP_S))


class ShardPhase(StrEnum):
    PLACED = "placed"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"
    """Its replica was lost: whatever the shard last reported, nobody vouches for it now."""


ENGINE_ENDS = frozenset({ShardPhase.STOPPED, ShardPhase.FAILED})
"""Shard phases that say how its engine ended, as its agent reported it."""


class Shard(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    node_id: str
    gpus: tuple[int, ...]
    port: int
    phase: ShardPhase = ShardPhase.PLACED
    pid: int | None = None
    came_up: bool = False
    error: str | None = None
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    epoch: int | None = None
    """Leader epoch that placed or last adopted this shard: a later leader adopts it."""
    stop_reason: str | None = None
    """Why its agent stopped it of its own accord (``agent shutting down``), while it is
    stopped so: the shard is started again where it was placed once its node is back."""

    @property
    def stopped_by_agent(self) -> bool:
        return self.phase is ShardPhase.STOPPED and self.stop_reason is not None


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    number: int
    phase: ReplicaPhase
    shards: tuple[Shard, ...]
    placed_at: datetime
    reason: str = ""
    replaces: str | None = None
    starting_since: datetime | None = None
    serving_since: datetime | None = None
    drain_id: str | None = None
    drain_started_at: datetime | None = None
    replacement_id: str | None = None
    routable: bool = False
    stopping_since: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None
    surplus: bool = False
    """Stopped because its model had its desired count without it (``ReplicaStopping``)."""
    gpu_move_called_off: bool = False
    """An operator called off the reconciler's move of it off an unhealthy GPU
    (``app.domain.gpu_moves``): it stays where it is, and is not moved so again."""
    routing: RoutingSettings | None = None
    agent_stopped_at: datetime | None = None
    """When an agent last stopped one of its shards of its own accord, until it serves
    again: the replica keeps its placement and waits for its node (see ``Shard``)."""
    revision: int = FIRST_REVISION
    """The revision of its model it was placed with; it runs that one until it is replaced."""

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(shard.node_id for shard in self.shards))

    @property
    def end_told_whole(self) -> str | None:
        """Its end reason where that says by itself how it ended (a startup timeout's:
        ``timed out starting after 5s (limit 5s)``), so a text that names the end does not
        say the phase again; None where the reason needs the phase beside it."""
        return self.end_reason if self.phase is ReplicaPhase.TIMED_OUT else None

    def takes_shard_news(self, shard: Shard, phase: ShardPhase) -> bool:
        """Whether news that its ``shard`` is now in ``phase`` (a start, a ready, an
        adoption, an end) still changes the shard: any news while the replica is active.
        Once it has ended, only the end of an engine whose end the log does not have yet
        (stopped or failed, once, from placed, starting, ready or lost): a start, a ready
        or an adoption would bring the shard back, and a second end would overwrite how
        its engine first ended."""
        if self.phase not in ENDED_PHASES:
            return True
        return phase in ENGINE_ENDS and shard.phase not in ENGINE_ENDS


class ReplicaFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Replicas of ``model``, with a shard on ``node_id``, in ``phase`` (each if given), and
    only those not ended unless ``ended``."""

    model: str | None = None
    node_id: str | None = None
    phase: ReplicaPhase | None = None
    ended: bool = True
    """Whether replicas in an ended phase (``ENDED_PHASES``) are among them: a fleet ends
    thousands a day, and who asks for the replicas that exist leaves them out. With an ended
    ``phase``, ``ended=False`` matches none."""

    def matches(self, replica: Replica) -> bool:
        return (
            (self.model is None or replica.model == self.model)
            and (self.node_id is None or self.node_id in replica.node_ids)
            and (self.phase is None or replica.phase is self.phase)
            and (self.ended or replica.phase not in ENDED_PHASES)
        )


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """A replica being replaced: drained on its own or with its node, or by a rollout
    (``move_id`` is that drain's or rollout's id). It serves until ``replacement_id``, a
    replica of the model's current revision, has served for the stability window; the move
    ends when it leaves routing (or is called off)."""

    replica_id: str
    move_id: str
    started_at: datetime
    reason: str = ""
    replacement_id: str | None = None
    """The replica placed to replace it, while that one has not ended."""


class RolloutState(StrEnum):
    RUNNING = "running"
    """Replacing replicas step by step, or holding a step for its verdict."""
    PAUSED = "paused"
    """Stopped where it was by an operator, or by a verdict that could not be reached:
    moves already under way finish, no new one starts, no verdict is reached."""
    ROLLING_BACK = "rolling_back"
    """The model is back at the revision it came from; replicas of the new one are being
    replaced by it."""
    SUCCEEDED = "succeeded"
    ROLLED_BACK = "rolled_back"
    ENDED = "ended"
    """Ended before it could finish: its model was removed."""


UNDER_WAY = frozenset({RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.ROLLING_BACK})


class Rollout(msgspec.Struct, frozen=True, kw_only=True):
    """A model's move from one revision to the next (``app.domain.rollout``): its id is its
    correlation id in the log."""

    id: str
    revision: int
    """The revision it brings in."""
    from_revision: int
    from_spec: ModelSpec
    """The spec of ``from_revision``: what a rollback or an undo goes back to."""
    started_at: datetime
    undoes: str | None = None
    """The rollout an undo started this one to undo; None when a declaration started it."""
    state: RolloutState = RolloutState.RUNNING
    step: int = 0
    """Index into the policy's ``all_steps``."""
    step_started_at: datetime | None = None
    """None until the reconciler has recorded the step's start."""
    holding_since: datetime | None = None
    """When the step's replicas all served and its hold began; None before."""
    hold_ejections: dict[str, int] = {}
    """The model's replicas the gateways ejected for failing during this hold
    (``RolloutHoldEjectionSeen``): replica id -> the most gateways recorded ejecting it at
    once. The verdict counts them; empty again when a step starts or its hold starts over."""
    promoted: bool = False
    """The current step's hold is over and it was promoted: the next step may start."""
    paused_by_verdict: bool = False
    """The current step's verdict was inconclusive and paused the rollout: a resume promotes
    the step. A step the operator paused is judged as usual once resumed, however long the
    pause outlasted its hold."""
    pause_reason: str | None = None
    verdict: str | None = None
    """The last verdict and why."""
    failures: int = 0
    """Replicas of ``revision`` that failed or timed out at start during the rollout."""
    last_failure: str | None = None
    finished_at: datetime | None = None
    outcome: str | None = None

    @property
    def under_way(self) -> bool:
        return self.state in UNDER_WAY


class Model(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    spec: ModelSpec
    declared_at: datetime
    replicas_created: int = 0
    removed: bool = False
    unplaceable_reason: str | None = None
    tuned_summary: dict[str, Any] | None = None
    failures: int = 0
    """Replicas that failed or timed out in a row, counting those that crashed within
    ``STEADY_SERVING_S`` of serving; reset once one has served that long."""
    failed_on: dict[str, int] = {}
    """The nodes those replicas ran on, each with how many of them: placement puts the
    next replica on a node with the fewest (``placement.rank``), so a node that cannot run
    the model (its file missing or unreadable there, a broken driver) does not take every
    attempt while another has room. Reset when one serves."""
    backoff_until: datetime | None = None
    last_failed_at: datetime | None = None
    """When the last of ``failures`` was counted: a replica that began serving after it,
    and has served ``STEADY_SERVING_S``, ends the streak (one serving since before the
    failures began does not: they happen beside it)."""
    ended: tuple[str, ...] = ()
    """Ids of its last ``ENDED_KEPT_PER_MODEL`` ended replicas, in the order they ended: the
    fold forgets the first when one more ends."""
    unreplaced_ends: tuple[str, ...] = ()
    """Ids of the replicas among ``ended`` that ended unasked (``UNASKED_ENDS``) while they
    counted towards the desired count, in the order they ended, whose place no placement
    has taken yet: each placement below the desired count (not a move's replacement) takes
    the first one's place and names it in its reason (``desired_count``)."""
    forgotten: dict[str, int] = {}
    """Replicas of this model the fold forgot, by phase (``stopped``: 12), so counts of its
    replicas by phase still include them."""
    revision: int = FIRST_REVISION
    """Its current revision: what a replica placed now runs (``app.domain.revisions``)."""
    earlier_specs: dict[int, ModelSpec] = {}
    """The specs of earlier revisions that its active replicas were placed with, by
    revision: a shard of one that starts again (its agent stopped it, or it was placed and
    not started yet) starts with the spec of its replica's revision, not the current one.
    Kept from the declaration that replaced them to the first one after their last replica
    ended."""

    latest_revision: int = FIRST_REVISION
    """The highest revision it ever had: after a rollback its revision is lower, and the
    next change is numbered after this one, so a number never means two specs."""
    rollout: Rollout | None = None
    """Its rollout under way, or the last one it had."""
    moves: dict[str, Move] = {}
    """Its replicas being moved, by id: where a drain's or a rollout's progress is read."""

    @property
    def canary(self) -> tuple[int, float] | None:
        """``(revision, share)`` while a canary step sends that share of the model's
        requests to the replicas of that revision; None otherwise."""
        rollout = self.rollout
        if rollout is None or rollout.state not in (RolloutState.RUNNING, RolloutState.PAUSED):
            return None
        steps = self.spec.rollout.all_steps
        if rollout.step >= len(steps) or rollout.step_started_at is None:
            return None
        traffic = steps[rollout.step].traffic
        return None if traffic is None else (rollout.revision, traffic)

    def spec_of(self, revision: int) -> ModelSpec:
        """The spec a replica placed with ``revision`` runs."""
        return self.earlier_specs.get(revision, self.spec)

    @property
    def desired(self) -> int:
        return 0 if self.removed else self.spec.replicas


class GpuCordon(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU of a node an operator cordoned (``gpu_cordoned``): placement puts no new
    shard on it. Known as GPUs are (``app.domain.gpu_identity``): by its UUID, by its
    index without one."""

    index: int
    uuid: str
    reason: str
    by: str
    """The operator who cordoned it."""


class Node(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    address: str
    registered_at: datetime
    labels: dict[str, str] = {}
    gpus: tuple[GpuInfo, ...] = ()
    agent_version: str = ""
    port_range: tuple[int, int] = (20000, 20999)
    connected: bool = False
    remote_address: str = ""
    last_change_at: datetime | None = None
    lost: bool = False
    disconnect_reason: str | None = None
    """Why its last connection ended (``node_disconnected``), shortened to
    ``app.domain.evolve.nodes.DISCONNECT_REASON_KEPT`` characters; None while connected
    and before its first disconnection."""
    cordoned: bool = False
    cordon_reason: str | None = None
    drain_id: str | None = None
    drain_grace_s: float | None = None
    drain_requested_at: datetime | None = None
    drain_began_with: tuple[str, ...] = ()
    """The replicas serving on the node (or being moved off it) when its drain was
    requested: the drain's outcome says what became of each, whoever ended it."""
    drain_cancelled_by: str | None = None
    """Who called the node's drain off (``node_drain_cancelled``), until the reconciler
    finishes it as cancelled."""
    stray_stops: tuple[str, ...] = ()
    """``replica/shard/pid`` of the last strays stopped here, so each is recorded once."""
    certificate_serial: str = ""
    """The certificate its agent last connected with."""
    connected_position: int = 0
    """The log position of the ``node_connected`` that opened its current connection (or
    its last one): a ``node_connected`` while the log has it connected (its connection
    replaced by another, a failover) keeps it.
    Of the connected nodes that list one GPU UUID, the one connected the longest holds it
    (``app.domain.gpu_claims``)."""
    unlisted_gpus: tuple[GpuInfo, ...] = ()
    """GPUs the log knew unhealthy when a hello stopped listing them, as it knew them: not
    the node's (nothing is placed on them), but a hello that lists one again, under any
    index, records its recovery, or a fault other than the one known, against it. A GPU is
    known by its UUID (``app.domain.gpu_identity``), so one whose index another GPU took
    is kept here. One per GPU, the latest 64 left out
    (``app.domain.evolve.nodes.UNLISTED_GPUS_KEPT``)."""
    ports_held_elsewhere: tuple[int, ...] = ()
    """Ports of its range where a shard failed because a process that is not an engine of
    ours listens there (``ShardFailed.port_held_elsewhere``): placement skips them until the
    node's next hello, when its agent may have been restarted with the port freed. The
    latest ``app.domain.evolve.shards.HELD_PORTS_KEPT``, oldest first."""
    gpu_cordons: tuple[GpuCordon, ...] = ()
    """Its GPUs an operator cordoned, in the order they were cordoned; a cordon stays
    while its GPU is not listed (it is the GPU's, not the index's)."""


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    prefix: str
    secret_hash: str
    models: tuple[str, ...]
    rpm: int | None
    tpm: int | None
    created_at: datetime
    created_by: str
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    expires_at: datetime | None = None
    """When the key stops working; None: never. Expiry is no event: ``expired`` asks the
    clock."""

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def live(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and not self.expired(now)


class CertificateRevocation(msgspec.Struct, frozen=True, kw_only=True):
    """One certificate (``serial``) or every certificate of a node issued until
    ``revoked_at`` (``node_id`` alone) may no longer connect."""

    serial: str | None
    node_id: str | None
    reason: str
    revoked_at: datetime
    revoked_by: str

    @property
    def key(self) -> str:
        return revocation_key(self.serial, self.node_id)


def revocation_key(serial: str | None, node_id: str | None) -> str:
    """How revocations are filed: ``serial:<hex>``, or ``node:<id>`` for a whole node."""
    return f"serial:{serial}" if serial is not None else f"node:{node_id}"


class ClusterState:
    """Everything the log says, up to ``position``."""

    __slots__ = ("forgotten", "keys", "models", "nodes", "position", "replicas", "revocations")

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.models: dict[str, Model] = {}
        self.replicas: dict[str, Replica] = {}
        self.keys: dict[str, ApiKey] = {}
        self.revocations: dict[str, CertificateRevocation] = {}
        self.position = 0
        self.forgotten: list[Replica] | None = None
        """When a list, every replica the fold forgets is appended to it, as it was then:
        ``projections rebuild`` keeps their rows that way. Not part of the state (a copy
        or a snapshot leaves it out)."""

    def shard(self, replica_id: str, index: int) -> Shard | None:
        """The replica's shard ``index``; None when the state knows no such replica or shard
        (an event or a report may name any)."""
        replica = self.replicas.get(replica_id)
        if replica is None or not 0 <= index < len(replica.shards):
            return None
        return replica.shards[index]

    def copy(self) -> ClusterState:
        """A snapshot that later events will not change (entities are frozen)."""
        other = ClusterState()
        other.nodes = dict(self.nodes)
        other.models = dict(self.models)
        other.replicas = dict(self.replicas)
        other.keys = dict(self.keys)
        other.revocations = dict(self.revocations)
        other.position = self.position
        return other
