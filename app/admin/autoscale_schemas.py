"""The autoscaling policy as the admin API reads and shows it, and the autoscaler's last
decision about a model (wire schemas, apart from ``app.domain.model_spec.AutoscalePolicy``)."""

from __future__ import annotations

from datetime import datetime

import msgspec


class AutoscalePolicyBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Replicas that follow demand; a field left out (or null) takes its default: ``min`` 1,
    ``max`` 1, ``target`` 4, ``capacity`` none, ``up_window_s`` 10, ``down_window_s`` 300,
    ``down_window_min_share`` 1, ``idle_to_zero_s`` 900, ``max_step`` 4,
    ``cold_start_timeout_s`` 300."""

    min_replicas: int | None = msgspec.field(name="min", default=None)
    max_replicas: int | None = msgspec.field(name="max", default=None)
    target: float | None = None
    capacity: float | None = None
    up_window_s: float | None = None
    down_window_s: float | None = None
    down_window_min_share: float | None = None
    idle_to_zero_s: float | None = None
    max_step: int | None = None
    cold_start_timeout_s: float | None = None


class AutoscalePolicyPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Only the fields to change, merged on the server with the model's policy (the
    defaults of ``AutoscalePolicyBody`` when it has none): a field left out keeps its value,
    one sent as null goes back to its default (``capacity`` null: no capacity)."""

    min_replicas: int | msgspec.UnsetType | None = msgspec.field(name="min", default=msgspec.UNSET)
    max_replicas: int | msgspec.UnsetType | None = msgspec.field(name="max", default=msgspec.UNSET)
    target: float | msgspec.UnsetType | None = msgspec.UNSET
    capacity: float | msgspec.UnsetType | None = msgspec.UNSET
    up_window_s: float | msgspec.UnsetType | None = msgspec.UNSET
    down_window_s: float | msgspec.UnsetType | None = msgspec.UNSET
    down_window_min_share: float | msgspec.UnsetType | None = msgspec.UNSET
    idle_to_zero_s: float | msgspec.UnsetType | None = msgspec.UNSET
    max_step: int | msgspec.UnsetType | None = msgspec.UNSET
    cold_start_timeout_s: float | msgspec.UnsetType | None = msgspec.UNSET


class AutoscalePolicyView(msgspec.Struct, frozen=True, kw_only=True):
    min_replicas: int = msgspec.field(name="min")
    max_replicas: int = msgspec.field(name="max")
    target: float
    """Requests (in flight plus queued) one replica should carry."""
    capacity: float | None
    """When set and bench measured the model: the share of its benched capacity one
    replica should carry instead of ``target``."""
    up_window_s: float
    down_window_s: float
    down_window_min_share: float
    """The least share of ``down_window_s`` a scale-down waits (a drop from ``n`` replicas
    to ``c`` waits ``max(this, c / n)`` of it)."""
    idle_to_zero_s: float
    max_step: int
    cold_start_timeout_s: float


class ScaleInputsView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the autoscaler saw; ``down_wait_s`` and ``down_wait_max`` only for a scale-down
    (and in decisions recorded since they exist)."""

    demand: float
    """Requests in flight on the model's replicas plus those queued for it, over every
    gateway with a fresh report, when the autoscaler decided."""
    per_replica: float
    """What one replica should carry."""
    per_replica_from: str
    """Where ``per_replica`` comes from: the policy's ``target``, or a share of what bench
    measured."""
    up_window_mean: float | None
    down_window_max: float | None
    samples: int
    """Demand samples the decision had."""
    down_wait_s: float | None = None
    """A scale-down's wait: ``down_window_s``, or the share of it a deeper drop waits."""
    down_wait_max: float | None = None
    """The highest up-window mean over that wait."""


class AutoscaleDecisionView(msgspec.Struct, frozen=True, kw_only=True):
    """The autoscaler's last change of a model's count (its last ``model_scaled``)."""

    position: int
    """Its place in the log."""
    recorded_at: datetime
    replicas: int
    previous: int
    reason: str
    inputs: ScaleInputsView | None
