"""Replicas that follow demand (``ModelSpec.autoscale``), and the checks of the policy."""

from __future__ import annotations

import msgspec

from app.domain.spec_bounds import MAX_REPLICAS
from app.domain.spec_error import SpecError, need_into

MIN_AUTOSCALE_TARGET = 0.01
"""The least a replica may be asked to carry: a hundredth of a request. Below it the count
the demand needs (demand / target) grows past any float and no longer rounds to a number."""
MAX_AUTOSCALE_TARGET = 100_000.0
MIN_AUTOSCALE_CAPACITY = 0.01
"""The least share of the benched capacity: a hundredth, for the same reason."""
MAX_AUTOSCALE_WINDOW_S = 86_400.0
MAX_COLD_START_S = 3_600.0


class AutoscalePolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replicas that follow demand (``docs/autoscaling.md``).

    Demand is the requests the gateways have in flight on the model's replicas plus those
    they hold queued for it. One replica should carry ``target`` of it, or, when ``capacity``
    is set and ``llmgw-cli bench`` measured the model, that share of the concurrency bench
    found it serves within its SLO. The count goes up as soon as the demand averaged over
    ``up_window_s`` needs more, down only after ``down_window_s`` in which the highest demand
    needed fewer (a drop to ``c`` of ``n`` replicas after ``max(down_window_min_share, c / n)``
    of it), by at most ``max_step`` replicas a decision, never outside ``[min, max]``. With
    ``min`` 0, a model without demand for ``idle_to_zero_s`` has none; a request for it is
    held by the gateway for up to ``cold_start_timeout_s`` while one starts."""

    min_replicas: int = msgspec.field(name="min", default=1)
    max_replicas: int = msgspec.field(name="max", default=1)
    target: float = 4.0
    capacity: float | None = None
    up_window_s: float = 10.0
    down_window_s: float = 300.0
    down_window_min_share: float = 1.0
    """The least share of ``down_window_s`` a scale-down waits: a drop from ``n`` replicas
    to ``c`` waits ``max(down_window_min_share, c / n)`` of the window, so that halving the
    count waits half of it. 1: every drop waits the whole window."""
    idle_to_zero_s: float = 900.0
    max_step: int = 4
    cold_start_timeout_s: float = 300.0


def autoscale_policy_errors(policy: AutoscalePolicy) -> list[SpecError]:
    """What is wrong with an autoscaling policy, by the name of each field as written."""
    errors: list[SpecError] = []
    need = need_into(errors)

    low, high = policy.min_replicas, policy.max_replicas
    need(0 <= low <= MAX_REPLICAS, "min", f"must be between 0 and {MAX_REPLICAS}")
    need(1 <= high <= MAX_REPLICAS, "max", f"must be between 1 and {MAX_REPLICAS}")
    need(low <= high, "max", f"must be at least min ({low})")
    need(
        MIN_AUTOSCALE_TARGET <= policy.target <= MAX_AUTOSCALE_TARGET,
        "target",
        f"must be between {MIN_AUTOSCALE_TARGET:g} and {MAX_AUTOSCALE_TARGET:g} "
        "(requests a replica carries)",
    )
    need(
        policy.capacity is None or MIN_AUTOSCALE_CAPACITY <= policy.capacity <= 1,
        "capacity",
        f"must be between {MIN_AUTOSCALE_CAPACITY:g} and 1 (a share of the capacity bench "
        "measured), or absent",
    )
    for field, value in (
        ("up_window_s", policy.up_window_s),
        ("down_window_s", policy.down_window_s),
        ("idle_to_zero_s", policy.idle_to_zero_s),
    ):
        need(
            0 <= value <= MAX_AUTOSCALE_WINDOW_S,
            field,
            f"must be between 0 and {MAX_AUTOSCALE_WINDOW_S:g} (a day)",
        )
    need(
        0 < policy.down_window_min_share <= 1,
        "down_window_min_share",
        "must be in (0, 1] (the least share of down_window_s a scale-down waits)",
    )
    need(1 <= policy.max_step <= MAX_REPLICAS, "max_step", f"must be between 1 and {MAX_REPLICAS}")
    need(
        0 < policy.cold_start_timeout_s <= MAX_COLD_START_S,
        "cold_start_timeout_s",
        f"must be more than 0 and at most {MAX_COLD_START_S:g} (an hour)",
    )
    return errors
