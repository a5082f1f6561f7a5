"""The admin API's bodies and views of a model: its spec as sent and as shown, its rollout,
an apply's preview, a scale (wire schemas, kept apart from ``app.domain.model_spec``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from app.admin.autoscale_schemas import (
    AutoscaleDecisionView,
    AutoscalePolicyBody,
    AutoscalePolicyView,
)
from app.admin.replica_schemas import ReplicaTrafficView
from app.domain.model_spec import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_PREFIX_BYTES,
    DEFAULT_ROUTING_POLICY,
    SESSION_KEY_SOURCES,
)

RoutingPolicy = Literal["least_loaded", "prefix", "session"]
SessionKeySource = Literal["header", "prompt_cache_key", "user"]


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
    waiting_to_move: list[str] = []
    """Replicas on an unhealthy GPU whose move off it waits for the model's moves under way
    (at most ``max_moves`` at a time), each with why."""
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


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    replicas: int
