"""What the admin API answers about nodes, models, replicas, placement, drains and the log,
as far as llmgw-cli renders it (``--output json`` prints the answers whole).

Declared from the API's JSON, never imported from the server: fields the CLI does not show
are left out, and every field has a default so that an older or newer server still reads.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from cli.client import EventView


class View(msgspec.Struct, frozen=True, kw_only=True):
    pass


# -- nodes -------------------------------------------------------------------------------


class NodeSummary(View, frozen=True, kw_only=True):
    id: str
    address: str = ""
    connected: bool = False
    lost: bool = False
    cordoned: bool = False
    drain_id: str | None = None
    labels: dict[str, str] = {}
    gpus: int = 0
    healthy_gpus: int = 0
    free_gpus: int = 0
    cordoned_gpus: list[int] = []
    """Indexes of its GPUs an operator cordoned."""
    held_elsewhere_gpus: list[int] = []
    """Indexes of its GPUs whose UUID another node holds; none from older servers."""
    replicas: int = 0
    disconnect_reason: str | None = None
    """Why its last connection ended; none while connected (and from older servers)."""


class ConnectionView(View, frozen=True, kw_only=True):
    connected: bool = False
    lost: bool = False
    address: str = ""
    remote_address: str = ""
    agent_version: str = ""
    since: datetime | None = None
    disconnect_reason: str | None = None
    """Why its last connection ended; none while connected (and from older servers)."""


class GpuView(View, frozen=True, kw_only=True):
    index: int
    uuid: str = ""
    """As ``nvidia-smi -L`` gives it; empty for a GPU the agent could not read it of."""
    name: str = ""
    memory_total_mib: int = 0
    memory_used_mib: int = 0
    healthy: bool = True
    used_by: str | None = None
    excluded_because: str | None = None
    cordoned: bool = False
    cordon_reason: str | None = None
    cordoned_by: str | None = None
    held_elsewhere_by: str | None = None
    """The node that holds its UUID; none from older servers."""


class UnlistedGpuCordonView(View, frozen=True, kw_only=True):
    index: int
    uuid: str = ""
    cordon_reason: str | None = None
    cordoned_by: str = ""


class NodeDrainView(View, frozen=True, kw_only=True):
    drain_id: str
    grace_s: float | None = None
    requested_at: datetime | None = None


class NodeReplicaView(View, frozen=True, kw_only=True):
    id: str
    model: str = ""
    phase: str = ""
    shards: list[int] = []


class NodeView(View, frozen=True, kw_only=True):
    id: str
    connection: ConnectionView = ConnectionView()
    labels: dict[str, str] = {}
    port_range: list[int] = []
    gpus: list[GpuView] = []
    cordoned: bool = False
    cordon_reason: str | None = None
    drain: NodeDrainView | None = None
    replicas: list[NodeReplicaView] = []
    unlisted_gpu_cordons: list[UnlistedGpuCordonView] = []


class NodeChange(View, frozen=True, kw_only=True):
    changed: bool
    node: NodeView


# -- models ------------------------------------------------------------------------------


class AutoscaleView(View, frozen=True, kw_only=True):
    """A model's autoscaling policy (``autoscale`` of its spec)."""

    min_replicas: int = msgspec.field(name="min", default=1)
    max_replicas: int = msgspec.field(name="max", default=1)
    target: float = 4.0
    capacity: float | None = None
    up_window_s: float = 10.0
    down_window_s: float = 300.0
    down_window_min_share: float = 1.0
    idle_to_zero_s: float = 900.0
    max_step: int = 4
    cold_start_timeout_s: float = 300.0


class RoutingView(View, frozen=True, kw_only=True):
    """How the gateways pick among a model's replicas (``routing`` of its spec)."""

    policy: str = "least_loaded"
    load_factor: float = 0.25
    prefix_bytes: int = 1024
    session_keys: list[str] = msgspec.field(
        default_factory=lambda: ["header", "prompt_cache_key", "user"]
    )
    """The admin API leaves the sources out while they are the default ones, these three;
    an empty list is one it sends: no session key is read."""
    max_in_flight: int | None = None


class ModelSpecView(View, frozen=True, kw_only=True):
    command: str = ""
    engine: str = ""
    gpus_per_shard: int = 0
    gpu_memory_gib: float = 0.0
    shards_per_replica: int = 0
    node_selector: dict[str, str] = {}
    startup_timeout_s: float = 0.0
    routing: RoutingView = RoutingView()
    autoscale: AutoscaleView | None = None
    """None: the replica count is what operators set."""
    apis: list[str] = []
    """The APIs the gateway serves the model on."""


class ScaleInputsView(View, frozen=True, kw_only=True):
    demand: float = 0.0
    per_replica: float = 0.0
    per_replica_from: str = ""
    up_window_mean: float | None = None
    down_window_max: float | None = None
    samples: int = 0
    down_wait_s: float | None = None
    down_wait_max: float | None = None


class AutoscaleDecisionView(View, frozen=True, kw_only=True):
    """The autoscaler's last change of a model's count."""

    recorded_at: datetime | None = None
    replicas: int = 0
    previous: int = 0
    reason: str = ""
    inputs: ScaleInputsView | None = None


class ModelView(View, frozen=True, kw_only=True):
    name: str
    removed: bool = False
    desired: int = 0
    serving: int = 0
    counting: int = 0
    phases: dict[str, int] = {}
    below_desired_because: list[str] = []
    unplaceable_reason: str | None = None
    failures: int = 0
    backoff_until: datetime | None = None
    spec: ModelSpecView = ModelSpecView()
    revision: int = 1
    outdated: list[str] = []
    """Active replicas running another revision than ``revision``."""
    waiting_to_move: list[str] = []
    """Replicas on an unhealthy GPU waiting for their turn to move, each with why."""
    traffic_by_revision: dict[str, ReplicaTrafficView] | None = None
    """One model's answer only: what the gateways saw of its replicas, per revision."""
    rollout: ModelRolloutView | None = None
    """Its rollout under way, or its last one."""
    last_autoscale: AutoscaleDecisionView | None = None
    """One model's answer only: the autoscaler's last change of its count."""


class ModelChange(View, frozen=True, kw_only=True):
    changed: bool
    model: ModelView


class SpecFieldChange(View, frozen=True, kw_only=True):
    field: str
    old: str | None = None
    new: str | None = None


class ApplyPreview(View, frozen=True, kw_only=True):
    """What declaring a spec would do (``POST /admin/v1/models/{name}/preview``)."""

    model: str
    outcome: str
    """``new``, ``unchanged``, ``at_once``, ``new_revision`` or ``declared_again``."""
    revision: int = 1
    from_revision: int | None = None
    revision_changes: list[SpecFieldChange] = []
    at_once: list[SpecFieldChange] = []
    rollout_id: str | None = None
    supersedes: str | None = None


# -- replicas ----------------------------------------------------------------------------


class ReplicaEjectionView(View, frozen=True, kw_only=True):
    ejected_by: int = 0
    gateways: int = 0


class ReplicaSummary(View, frozen=True, kw_only=True):
    id: str
    model: str = ""
    phase: str = ""
    nodes: list[str] = []
    serving_since: datetime | None = None
    routable: bool = False
    drain_id: str | None = None
    replaces: str | None = None
    replacement_id: str | None = None
    revision: int = 1
    current_revision: int | None = None
    ejection: ReplicaEjectionView | None = None
    held_elsewhere_gpus: dict[str, list[int]] = {}
    """Its nodes with a GPU of its shards another node holds the UUID of, and those GPUs'
    indexes; none from older servers."""


class GpuHeldElsewhereView(View, frozen=True, kw_only=True):
    index: int = 0
    uuid: str = ""
    held_by: str = ""
    reason: str = ""


class ShardView(View, frozen=True, kw_only=True):
    index: int
    node_id: str = ""
    gpus: list[int] = []
    port: int = 0
    phase: str = ""
    pid: int | None = None
    error: str | None = None
    exit_code: int | None = None
    log_tail: list[str] = []
    stop_reason: str | None = None
    gpus_held_elsewhere: list[GpuHeldElsewhereView] = []
    """Its GPUs whose UUID another node holds; none from older servers."""


class ReplicaTrafficView(View, frozen=True, kw_only=True):
    window_s: float = 60.0
    gateways: int = 0
    requests: int = 0
    errors: int = 0
    cancelled: int = 0
    abandoned: int = 0
    error_rate: float | None = None
    ttft_p95_ms: float | None = None
    ttft_samples: int = 0
    tpot_p95_ms: float | None = None
    tpot_samples: int = 0
    latency_p95_ms: float | None = None
    latency_samples: int = 0
    unlisted: int = 0
    """Gateways whose report may have left these replicas out: the figures may lack
    requests; none from older servers."""


class ReplicaView(ReplicaSummary, frozen=True, kw_only=True):
    reason: str = ""
    starting_since: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None
    shards: list[ShardView] = []
    traffic: ReplicaTrafficView | None = None


# -- placement ---------------------------------------------------------------------------


class CandidateView(View, frozen=True, kw_only=True):
    node_id: str
    eligible: bool = False
    reasons: list[str] = []
    gpus: list[int] = []
    port: int | None = None
    same_model_replicas: int = 0
    usable_gpus: int = 0
    failures_here: int = 0
    """The model's replicas that failed on the node since one of them last served."""
    ports_skipped: list[int] = []
    """Ports passed over because a process that is not our engine holds them."""


class PlacementView(View, frozen=True, kw_only=True):
    model: str = ""
    placeable: bool = False
    summary: str = ""
    candidates: list[CandidateView] = []


# -- drains and the log ------------------------------------------------------------------


class ReplicaRoomView(View, frozen=True, kw_only=True):
    """Whether a replica a node drain moves has somewhere to go now."""

    replica_id: str
    model: str = ""
    has_room: bool = True
    reason: str | None = None
    """Why not, as placement says it; null when it has room."""


class DrainAccepted(View, frozen=True, kw_only=True):
    drain_id: str
    grace_s: float | None = None
    room: list[ReplicaRoomView] = []


class MoveView(View, frozen=True, kw_only=True):
    """One move of a drain or a rollout: the original and its replacement once placed."""

    replica_id: str
    revision: int = 0
    replacement_id: str | None = None
    replacement_phase: str | None = None
    waiting_for: str | None = None
    """Why no replacement is placed yet, as placement last said."""


class DrainProgressView(View, frozen=True, kw_only=True):
    drain_id: str
    node_id: str | None = None
    requested_by: str = ""
    requested_at: datetime | None = None
    grace_s: float | None = None
    grace_ends_at: datetime | None = None
    state: str = "running"
    """``running``, ``succeeded``, ``failed`` or ``cancelled``."""
    finished: bool = False
    outcome: str | None = None
    replicas: list[ReplicaSummary] = []
    still_on_node: list[str] = []
    events: list[EventView] = []
    moves: list[MoveView] = []
    moves_called_off: list[str] = []
    """Those of ``still_on_node`` whose move was called off (an older server: none said)."""


class DrainChange(View, frozen=True, kw_only=True):
    changed: bool
    drain: DrainProgressView


class EventsPage(View, frozen=True, kw_only=True):
    events: list[msgspec.Raw] = []
    next_since: int = 0
    more: bool = False


# -- rollouts ----------------------------------------------------------------------------


class ModelRolloutView(View, frozen=True, kw_only=True):
    rollout_id: str
    state: str = ""
    revision: int = 0
    from_revision: int = 0
    step: int = 0
    steps: int = 0
    outcome: str | None = None
