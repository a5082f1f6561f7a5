"""The admin API's views of nodes, the requests that cordon, drain and forget one, and
where a model's replica could be placed (wire schemas)."""

from __future__ import annotations

from datetime import datetime

import msgspec


class CandidateView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    eligible: bool
    reasons: list[str]
    """Every reason the node cannot take a shard; empty when it can."""
    gpus: list[int]
    port: int | None
    same_model_replicas: int
    usable_gpus: int
    failures_here: int = 0
    """The model's replicas that failed on the node since one of them last served: placement
    passes over such a node while another has room."""
    ports_skipped: list[int] = []
    """Ports of the node's range passed over because a process that is not our engine
    holds them (a shard failed there for it since the node's last hello)."""


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


class ConnectionView(msgspec.Struct, frozen=True, kw_only=True):
    connected: bool
    lost: bool
    address: str
    remote_address: str
    agent_version: str
    since: datetime | None
    disconnect_reason: str | None
    """Why its last connection ended, at most 500 characters; null while connected."""


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
    """Every reason placement will not use this GPU for any model, in the order it checks
    them, joined by ``; ``; null when it may."""
    cordoned: bool = False
    """An operator cordoned it: no new shard is placed on it."""
    cordon_reason: str | None = None
    cordoned_by: str | None = None
    """The operator who cordoned it."""
    held_elsewhere_by: str | None = None
    """The node, connected longer, that lists its UUID too: no new shard is placed on it
    (docs/gpus.md); null for most."""


class UnlistedGpuCordonView(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's cordon of a GPU the node does not list now (pulled out of the
    machine), under the index and UUID it had when cordoned: it holds again if the GPU is
    listed again, and uncordoning that index lifts it."""

    index: int
    uuid: str
    cordon_reason: str | None
    cordoned_by: str
    """The operator who cordoned it."""


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
    """Healthy GPUs that no replica holds, no operator cordoned and whose UUID no other
    node holds."""
    cordoned_gpus: list[int] = []
    """Indexes of its GPUs an operator cordoned."""
    held_elsewhere_gpus: list[int] = []
    """Indexes of its GPUs whose UUID another node, connected longer, lists too: they take
    no new shard (``GET /admin/v1/nodes/{id}`` names that node)."""
    replicas: int
    """Active replicas with a shard here."""
    disconnect_reason: str | None = None
    """Why its last connection ended, at most 500 characters; null while connected."""


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
    unlisted_gpu_cordons: list[UnlistedGpuCordonView] = []
    """Cordons of GPUs the node no longer lists, in the order they were cordoned."""


class CordonRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: str = ""


class NodeChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    node: NodeView


class ForgetRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: str
    """Why the node is gone for good: one line, recorded in its history."""
    revoke_certificates: bool = False
    """Also revoke every certificate issued to the node until now, in the same append, so
    that its agent cannot come back under its id."""


class NodeForgetting(msgspec.Struct, frozen=True, kw_only=True):
    """A forgotten node: the state keeps nothing of it; its history stays."""

    node_id: str
    changed: bool
    """Always true: a forget records, or is refused (a request sent again with its
    idempotency key answers as the first did)."""
    certificates_revoked: bool


class DrainRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    grace_s: float = 600.0
    """Seconds the whole move may take (at most a week); what is left on the node then is
    stopped."""
    require_room: bool = False
    """Refuse the drain (409, nothing recorded) when a replica on the node has nowhere to
    go now; by default such a drain is recorded, and the answer says which replicas."""
