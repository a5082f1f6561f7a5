"""What a fold step changes in an entity, typed field by field.

``evolve``'s handlers say what an event changes as one of these dicts, so a misspelt field
or a value of the wrong type is a type error rather than a surprise at replay
(``msgspec.structs.replace`` takes any keyword). Every key is a field of its entity, and a
test keeps them so (``tests/unit/test_fold.py``); an entity's identity (its id, name or
index) is never among them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from app.domain.events import GpuInfo
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.state import GpuCordon, Move, ReplicaPhase, Rollout, RolloutState, Shard, ShardPhase


class ShardChanges(TypedDict, total=False):
    node_id: str
    gpus: tuple[int, ...]
    port: int
    phase: ShardPhase
    pid: int | None
    came_up: bool
    error: str | None
    exit_code: int | None
    log_tail: tuple[str, ...]
    epoch: int | None
    stop_reason: str | None


class ReplicaChanges(TypedDict, total=False):
    phase: ReplicaPhase
    shards: tuple[Shard, ...]
    reason: str
    replaces: str | None
    starting_since: datetime | None
    serving_since: datetime | None
    drain_id: str | None
    drain_started_at: datetime | None
    replacement_id: str | None
    routable: bool
    stopping_since: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    surplus: bool
    gpu_move_called_off: bool
    routing: RoutingSettings | None
    agent_stopped_at: datetime | None
    revision: int


class ModelChanges(TypedDict, total=False):
    spec: ModelSpec
    replicas_created: int
    removed: bool
    unplaceable_reason: str | None
    tuned_summary: dict[str, Any] | None
    failures: int
    failed_on: dict[str, int]
    backoff_until: datetime | None
    last_failed_at: datetime | None
    ended: tuple[str, ...]
    unreplaced_ends: tuple[str, ...]
    forgotten: dict[str, int]
    revision: int
    earlier_specs: dict[int, ModelSpec]
    latest_revision: int
    rollout: Rollout | None
    moves: dict[str, Move]


class NodeChanges(TypedDict, total=False):
    ports_held_elsewhere: tuple[int, ...]
    address: str
    labels: dict[str, str]
    gpus: tuple[GpuInfo, ...]
    agent_version: str
    port_range: tuple[int, int]
    connected: bool
    remote_address: str
    last_change_at: datetime | None
    lost: bool
    disconnect_reason: str | None
    cordoned: bool
    cordon_reason: str | None
    drain_id: str | None
    drain_grace_s: float | None
    drain_requested_at: datetime | None
    drain_began_with: tuple[str, ...]
    drain_cancelled_by: str | None
    stray_stops: tuple[str, ...]
    certificate_serial: str
    connected_position: int
    unlisted_gpus: tuple[GpuInfo, ...]
    gpu_cordons: tuple[GpuCordon, ...]


class GpuChanges(TypedDict, total=False):
    memory_used_mib: int
    healthy: bool
    unhealthy_reason: str | None


class RolloutChanges(TypedDict, total=False):
    state: RolloutState
    step: int
    step_started_at: datetime | None
    holding_since: datetime | None
    hold_ejections: dict[str, int]
    promoted: bool
    paused_by_verdict: bool
    pause_reason: str | None
    verdict: str | None
    finished_at: datetime | None
    outcome: str | None
