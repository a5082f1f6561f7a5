"""Response bodies of the admin API (wire schemas, kept apart from domain types and tables)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeVar

import msgspec

from app.admin.autoscale_schemas import (
    AutoscaleDecisionView,
    AutoscalePolicyBody,
    AutoscalePolicyView,
)
from app.domain.model_spec import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_PREFIX_BYTES,
    DEFAULT_ROUTING_POLICY,
    SESSION_KEY_SOURCES,
)

ViewT = TypeVar("ViewT")

RoutingPolicy = Literal["least_loaded", "prefix", "session"]
SessionKeySource = Literal["header", "prompt_cache_key", "user"]


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    recorded_at: datetime
    stream: str
    version: int
    type: str
    actor: str
    correlation_id: str | None
    causation_id: str | None
    summary: str
    data: dict[str, Any]


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    id: str
    events: list[EventView]
    next_after: int | None
    """Pass as ``after`` to read the next page; null when this page is the last, and when
    the page was read with ``before``."""
    next_before: int | None = None
    """For a page read with ``before``: pass as ``before`` to read the page of older events;
    null when this page is the oldest, and when the page was read without ``before``."""


def as_view(value: object, view: type[ViewT], **extra: object) -> ViewT:
    """``value`` (a domain struct) as the wire struct ``view``, with ``extra`` fields; fields
    the view does not declare are left out."""
    data = msgspec.to_builtins(value, builtin_types=(datetime,))
    return msgspec.convert({**data, **extra}, view)


# -- models ------------------------------------------------------------------------------


class RoutingBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    weight: float | None = None
    target_waiting: int | None = None
    kv_ceiling: float | None = None
    policy: RoutingPolicy | None = None
    """``least_loaded``, ``prefix`` or ``session`` (docs/gateway-routing.md)."""
    load_factor: float | None = None
    prefix_bytes: int | None = None
    session_keys: list[SessionKeySource] | None = None
    """Any of ``header`` (x-session-id), ``prompt_cache_key``, ``user``; first found wins."""
    max_in_flight: int | None = None
    """The most requests one gateway sends one replica at once (1 to 100000); the rest wait
    in the gateway's queue for the first replica with room. Null: no such bound."""


class CanaryStepBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    replicas: int | Literal["all"]
    """Replicas of the new revision the step brings up: a number, or ``"all"``."""
    traffic: float | None = None
    """The share of the model's requests they get, in (0, 1]; null: their share by weight."""
    hold_s: float | None = None
    """Seconds to hold the step before its verdict (0 to a week); null: no hold."""


class RolloutPolicyBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """How a new revision replaces the running one; a field left out takes its default."""

    max_surge: int | None = None
    max_unavailable: int | None = None
    stability_window_s: float | None = None
    steps: list[CanaryStepBody] | None = None
    max_failures: int | None = None
    max_error_rate_increase: float | None = None
    max_latency_ratio: float | None = None
    min_requests: int | None = None
    min_latency_samples: int | None = None


class ModelSpecBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """A model spec as sent to the API; a field left out (or null) takes its default."""

    name: str | None = None
    command: str
    engine: str | None = None
    env: dict[str, str] | None = None
    gpus_per_shard: int | None = None
    gpu_memory_gib: float | None = None
    shards_per_replica: int | None = None
    node_selector: dict[str, str] | None = None
    replicas: int | None = None
    startup_timeout_s: float | None = None
    stop_grace_s: float | None = None
    max_moves: int | None = None
    routing: RoutingBody | None = None
    rollout: RolloutPolicyBody | None = None
    autoscale: AutoscalePolicyBody | None = None
    """Null (or left out): the replica count is ``replicas``, as operators set it."""
    apis: list[str] | None = None
    """The APIs the gateway serves the model on; null (or left out): chat and completions."""


class RoutingView(msgspec.Struct, frozen=True, kw_only=True):
    weight: float
    target_waiting: int
    kv_ceiling: float


class ModelRoutingView(RoutingView, frozen=True, kw_only=True, omit_defaults=True):
    """A model's routing settings: those bench measures, and its routing policy (each of
    its fields left out while at its default, as a spec that never set one reads)."""

    policy: str = DEFAULT_ROUTING_POLICY
    load_factor: float = DEFAULT_LOAD_FACTOR
    prefix_bytes: int = DEFAULT_PREFIX_BYTES
    session_keys: tuple[str, ...] = SESSION_KEY_SOURCES
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        # omit_defaults leaves a field out when its value *is* the default object: a value
        # equal to it (read back from the log) is made that object, so it is left out too.
        for name, default in _ROUTING_POLICY_DEFAULTS:
            if getattr(self, name) == default:
                msgspec.structs.force_setattr(self, name, default)


_ROUTING_POLICY_DEFAULTS = (
    ("policy", DEFAULT_ROUTING_POLICY),
    ("load_factor", DEFAULT_LOAD_FACTOR),
    ("prefix_bytes", DEFAULT_PREFIX_BYTES),
    ("session_keys", SESSION_KEY_SOURCES),
)


class CanaryStepView(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int | Literal["all"]
    traffic: float | None
    hold_s: float


class RolloutPolicyView(msgspec.Struct, frozen=True, kw_only=True):
    max_surge: int
    max_unavailable: int
    stability_window_s: float | None
    """Null: the control plane's ``--stability-window``."""
    steps: list[CanaryStepView]
    """The canary steps as declared; after the last one every replica is replaced."""
    max_failures: int
    max_error_rate_increase: float
    max_latency_ratio: float
    min_requests: int
    min_latency_samples: int
    """Samples of a latency figure each side needs before its p95 is compared."""


class ModelSpecView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    command: str
    engine: str
    env: dict[str, str]
    gpus_per_shard: int
    gpu_memory_gib: float
    shards_per_replica: int
    node_selector: dict[str, str]
    replicas: int
    startup_timeout_s: float
    stop_grace_s: float
    max_moves: int
    routing: ModelRoutingView
    rollout: RolloutPolicyView
    autoscale: AutoscalePolicyView | None = None
    """Null: the replica count is what operators set."""
    apis: list[str] = msgspec.field(default_factory=lambda: ["chat", "completions"])
    """The APIs the gateway serves the model on."""


class ModelRolloutView(msgspec.Struct, frozen=True, kw_only=True):
    """A model's rollout under way, or the last one it had, in brief."""

    rollout_id: str
    state: str
    """``running``, ``paused``, ``rolling_back``, ``succeeded``, ``rolled_back`` or
    ``ended`` (its model was removed)."""
    revision: int
    """The revision it brings in."""
    from_revision: int
    step: int
    """The current step, from 0, of ``steps``."""
    steps: int
    """How many steps it runs, the last (every replica) included."""
    outcome: str | None
    status: str
    """Where its whole status is: ``/admin/v1/models/{name}/rollout``."""


class ModelView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    declared_at: datetime
    removed: bool
    desired: int
    serving: int
    counting: int
    """Placed, starting or serving: the replicas that count towards ``desired``."""
    phases: dict[str, int]
    below_desired_because: list[str]
    unplaceable_reason: str | None
    failures: int
    backoff_until: datetime | None
    spec: ModelSpecView
    revision: int
    """The model's current revision: what a replica placed now runs. A spec change that
    alters what runs (command, env, engine, GPU shape, shards, node selector) is the next."""
    outdated: list[str]
    """Active replicas placed with another revision than the current one (an older one, or
    a newer one rolled back): they run it until they are replaced."""
    rollout: ModelRolloutView | None = None
    """Its rollout under way, or the last one it had; null when it never had one."""
    traffic_by_revision: dict[str, ReplicaTrafficView] | None = None
    """``GET /admin/v1/models/{name}`` only (null in the list): what the gateways saw of the
    model's active replicas, added up per revision (keys are revision numbers); a revision
    none of whose replicas any gateway reported is absent, and so is all of it when no
    gateway reports traffic."""
    last_autoscale: AutoscaleDecisionView | None = None
    """``GET /admin/v1/models/{name}`` only (null in the list): the autoscaler's last change
    of the count, with why and what it saw; null when it never changed it."""


class ModelChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when the request changed nothing (and so recorded nothing)."""
    model: ModelView


class SpecFieldChange(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    """A field of the spec; nested settings dotted (``routing.weight``), environment
    variables ``env.NAME``."""
    old: str | None
    """Null: not set before. Values of ``env.*`` are never shown: ``(set)``."""
    new: str | None
    """Null: no longer set."""


class ApplyPreviewView(msgspec.Struct, frozen=True, kw_only=True):
    """What declaring a spec would do, as the declaration would decide it; nothing is
    recorded."""

    model: str
    outcome: Literal["new", "unchanged", "at_once", "new_revision", "declared_again"]
    """``new``: declared at revision 1; ``unchanged``: nothing recorded; ``at_once``: fields
    that take effect at once, same revision; ``new_revision``: what runs changes, and a
    rollout replaces the replicas; ``declared_again``: a removed model comes back."""
    revision: int
    """The model's revision once declared."""
    from_revision: int | None
    """Its revision now; null for a model not declared yet."""
    revision_changes: list[SpecFieldChange]
    """What makes it a new revision."""
    at_once: list[SpecFieldChange]
    """Other fields that change, taking effect at once for every replica."""
    rollout_id: str | None
    """The rollout the declaration would start."""
    supersedes: str | None = None
    """The rollout under way that it would supersede (it records nothing more; the new
    one starts from the revision it was rolling out)."""


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int


# -- placement ---------------------------------------------------------------------------


class CandidateView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    eligible: bool
    reasons: list[str]
    """Every reason the node cannot take a shard; empty when it can."""
    gpus: list[int]
    port: int | None
    same_model_replicas: int
    usable_gpus: int


class ShardPlacementView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    node_id: str
    gpus: list[int]
    port: int


class PlacementView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    shards: int
    gpus_per_shard: int
    gpu_memory_gib: float
    placeable: bool
    summary: str
    """Where a replica would go and why those nodes, or why it cannot be placed."""
    placement: list[ShardPlacementView] | None
    candidates: list[CandidateView]


# -- nodes -------------------------------------------------------------------------------


class ConnectionView(msgspec.Struct, frozen=True, kw_only=True):
    connected: bool
    lost: bool
    address: str
    remote_address: str
    agent_version: str
    since: datetime | None


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    healthy: bool
    unhealthy_reason: str | None
    used_by: str | None
    """The replica holding this GPU."""
    excluded_because: str | None
    """Why placement will not use this GPU for any model; null when it may."""


class NodeDrainView(msgspec.Struct, frozen=True, kw_only=True):
    drain_id: str
    grace_s: float | None
    requested_at: datetime | None


class NodeReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    phase: str
    shards: list[int]
    """Indexes of the replica's shards on this node."""


class NodeSummary(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    address: str
    connected: bool
    lost: bool
    cordoned: bool
    drain_id: str | None
    labels: dict[str, str]
    gpus: int
    healthy_gpus: int
    free_gpus: int
    """Healthy GPUs that no replica holds."""
    replicas: int
    """Active replicas with a shard here."""


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    registered_at: datetime
    connection: ConnectionView
    labels: dict[str, str]
    port_range: list[int]
    gpus: list[GpuView]
    cordoned: bool
    cordon_reason: str | None
    drain: NodeDrainView | None
    replicas: list[NodeReplicaView]


class CordonRequest(msgspec.Struct, frozen=True, kw_only=True):
    reason: str = ""


class NodeChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    node: NodeView


class DrainRequest(msgspec.Struct, frozen=True, kw_only=True):
    grace_s: float = 600.0
    """Seconds the whole move may take (at most a week); what is left on the node then is
    stopped."""
    require_room: bool = False
    """Refuse the drain (409, nothing recorded) when a replica on the node has nowhere to
    go now; by default such a drain is recorded, and the answer says which replicas."""


# -- replicas and drains -----------------------------------------------------------------


class ReplicaEjectionView(msgspec.Struct, frozen=True, kw_only=True):
    """How many live gateways keep a replica out of their rotation for failing requests
    in a row (docs/gateway.md#passive-health-ejection)."""

    ejected_by: int
    """Live gateways that eject it now (cooling off, or waiting for a probe to succeed)."""
    gateways: int
    """Live gateways that report ejections (those with a report of the last 5 s)."""


class ReplicaSummary(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    number: int
    phase: str
    nodes: list[str]
    placed_at: datetime
    serving_since: datetime | None
    routable: bool
    drain_id: str | None
    replaces: str | None
    replacement_id: str | None
    revision: int
    """The revision of its model it was placed with, and runs until it is replaced."""
    current_revision: int | None
    """Its model's revision now: greater than ``revision`` when the replica runs an older
    spec; null when its model is not known."""
    ejection: ReplicaEjectionView | None = None
    """How many live gateways eject it; null when no live gateway reports ejections (or
    the view does not say, as in a drain's)."""


class ShardView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    node_id: str
    gpus: list[int]
    port: int
    phase: str
    pid: int | None
    came_up: bool
    error: str | None
    exit_code: int | None
    log_tail: list[str]
    """The engine's last log lines, when the shard failed or was stopped before it was
    ever ready."""
    stop_reason: str | None = None
    """Why its agent stopped it of its own accord (``agent shutting down``), while it is
    stopped so; it starts again where it was placed once its node is back."""


class ReplicaTrafficView(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateways saw of a replica's requests over their window, all added up
    (docs/gateway.md#what-the-gateway-measures)."""

    window_s: float
    """The gateways' sliding window: the last this many seconds (less at most a twelfth)."""
    gateways: int
    """Gateways with a fresh report, whether or not they sent the replica anything."""
    requests: int
    """Answered and failed requests; cancelled ones are not counted here."""
    errors: int
    """The engine's failures: a 5xx or 429, no answer, or an answer that broke off."""
    cancelled: int
    """Requests whose client went away first: not errors."""
    error_rate: float | None
    """``errors / requests``, 0 to 1; null without requests."""
    ttft_p95_ms: float | None
    """Time to the first chunk of streamed 2xx answers, 95th percentile (within 4.4 %)."""
    ttft_samples: int
    tpot_p95_ms: float | None
    """Time per output token of finished streamed 2xx answers, 95th percentile."""
    tpot_samples: int
    latency_p95_ms: float | None
    """Time to the last byte of 2xx answers, streamed or not, 95th percentile."""
    latency_samples: int


class ReplicaView(ReplicaSummary, frozen=True, kw_only=True):
    reason: str
    starting_since: datetime | None
    drain_started_at: datetime | None
    stopping_since: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    shards: list[ShardView]
    traffic: ReplicaTrafficView | None = None
    """What the gateways measured of its requests; null when no gateway reports."""


class ReplicaRoomView(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a replica a node drain moves (or stops, not serving yet) has somewhere to go."""

    replica_id: str
    model: str
    has_room: bool
    """Whether placement finds a place for its replacement now, each replacement holding
    its GPUs for the next (or it has one already). Without room, it is stopped, not moved,
    when the grace runs out, unless room appears first."""
    reason: str | None = None
    """Why not, as placement says it (``llmgw-cli explain-placement MODEL``); null when it
    has room."""


class DrainAccepted(msgspec.Struct, frozen=True, kw_only=True):
    drain_id: str
    progress: str
    """Where to follow the drain."""
    grace_s: float | None = None
    """A node drain's grace; null for a replica drain."""
    room: list[ReplicaRoomView] = []
    """A node drain's replicas, by model and number, each with whether it has somewhere to
    go now, decided on the state the drain was recorded on; empty for a replica drain."""


class DrainProgressView(msgspec.Struct, frozen=True, kw_only=True):
    drain_id: str
    node_id: str | None
    requested_by: str
    requested_at: datetime
    grace_s: float | None
    grace_ends_at: datetime | None = None
    """When what is still on the node is stopped rather than moved; null for a replica
    drain."""
    state: Literal["running", "succeeded", "failed"]
    """``succeeded``: a node drain moved every replica, a replica drain's replicas were each
    replaced, or one that was not was stopped because its model had its count without it
    (a scale-down, a move an undo called off; the outcome names it); ``failed``: the grace
    ran out and what was left was stopped, or a replica being moved ended without a
    replacement otherwise (the outcome names it and why)."""
    finished: bool
    """Whether ``state`` is no longer ``running``."""
    outcome: str | None
    """What the drain came to, in words, for people; null while it runs."""
    replicas: list[ReplicaSummary]
    still_on_node: list[str]
    events: list[EventView]
    moves: list[MoveView] = []
    """Its moves under way: each original still serving and its replacement (once placed)."""


class MoveView(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    revision: int
    """The revision the original runs."""
    replacement_id: str | None
    replacement_phase: str | None
    waiting_for: str | None = None
    """Why no replacement is placed yet, as placement last said; null once one is placed."""


# -- health ------------------------------------------------------------------------------


class CheckView(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    detail: str


class ReadinessView(msgspec.Struct, frozen=True, kw_only=True):
    ready: bool
    role: str | None
    """The control plane's: ``leader`` or ``standby`` (``stopped`` while it shuts down);
    null where the API is served without one."""
    failing: list[str]
    """The names of the checks that failed, in ``checks`` order; empty when ready."""
    checks: dict[str, CheckView]
    """``database``, then ``migrations`` once the database answers."""


# -- API keys ----------------------------------------------------------------------------


class KeyRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    models: list[str]
    """The models the key may use; ``["*"]`` for every model, declared now or later."""
    rpm: int | None = None
    """Requests per minute; null for no limit."""
    tpm: int | None = None
    """Tokens per minute; null for no limit."""
    expires_at: datetime | None = None
    """When the key stops working: RFC 3339 with an offset, in the future, at most 10 years
    ahead; null for a key that never expires."""


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """A key as operators see it: never its secret, nor the secret's hash."""

    id: str
    """Its stream in the log: ``/admin/v1/history/key/{id}``."""
    prefix: str
    name: str
    models: list[str]
    """``["*"]`` when the key may use every model."""
    rpm: int | None
    tpm: int | None
    created_at: datetime
    created_by: str
    revoked: bool
    revoked_at: datetime | None
    revoked_by: str | None
    expires_at: datetime | None
    """When the key stops working (UTC); null: never."""
    expired: bool
    """Whether ``expires_at`` has passed by the server's clock when it answered."""


class KeyCreated(KeyView, frozen=True, kw_only=True):
    key: str
    """The whole key, shown this once: only its hash is stored."""


class KeyChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when the key was revoked already (nothing was recorded)."""
    key: KeyView
