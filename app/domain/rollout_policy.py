"""How a new revision of a model replaces the running one (``ModelSpec.rollout``), and its
checks."""

from __future__ import annotations

from typing import Literal

import msgspec

from app.domain.spec_bounds import MAX_REPLICAS
from app.domain.spec_error import SpecError, need_into

ALL: Literal["all"] = "all"
"""A canary step's ``replicas`` that means every replica of the model."""
MAX_CANARY_STEPS = 20
MAX_HOLD_S = 7 * 86_400
"""A week: a canary held longer than that is a second production, not a canary."""
MAX_STABILITY_WINDOW_S = 86_400
MAX_ROLLOUT_FAILURES = 1_000
MAX_MIN_REQUESTS = 1_000_000
MAX_MIN_LATENCY_SAMPLES = 1_000_000
DEFAULT_MIN_LATENCY_SAMPLES = 50
"""A p95 of fewer than 20 samples is their slowest, so one slow request decides it; of 50,
the third slowest: two stray requests on either side do not decide a verdict."""
MAX_LATENCY_RATIO = 100.0


class CanaryStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One step of a rollout: bring ``replicas`` of the new revision up (a number, or
    ``"all"``), send them ``traffic`` (a share of the model's requests, 0 to 1; None: their
    share by weight, as any replica), and hold ``hold_s`` seconds before the verdict."""

    replicas: int | Literal["all"]
    traffic: float | None = None
    hold_s: float = 0.0

    def count(self, desired: int) -> int:
        """How many replicas of the new revision the step brings up."""
        return desired if isinstance(self.replicas, str) else min(self.replicas, desired)


class RolloutPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a new revision replaces the running one (``docs/rollouts.md``).

    ``max_surge`` replicas of the new revision may run on top of the desired count while
    their originals still serve (each is a move); ``max_unavailable`` originals may stop
    before their replacement serves. ``stability_window_s``: how long a replacement serves
    before its original stops (None: the control plane's ``--stability-window``). ``steps``:
    canary steps; after the last one every remaining replica is replaced (an implicit
    ``{replicas: all}``). A step with a hold ends in a verdict, from the gateways'
    measurements of the new revision against the others: promote unless its error rate
    is more than ``max_error_rate_increase`` above theirs, or its TTFT, TPOT or latency
    p95 more than ``max_latency_ratio`` times theirs; with fewer than ``min_requests``
    requests on either side the verdict cannot be reached and the rollout pauses for an
    operator, unless the canary's errors alone put it above the allowed error rate at
    ``min_requests`` (it is rolled back), or the stable side saw too few and more than
    half of the canary's ``min_requests`` failed (it is rolled back too). A latency p95 is
    compared only once both sides have ``min_latency_samples`` samples of it; until then
    the verdict waits for them, and at the hold's end pauses as too few requests do. The
    gateways ejecting a replica of the new revision for failing (and none of the others)
    rolls it back. ``max_failures`` replicas of the new revision failing to start halt the
    rollout and roll it back."""

    max_surge: int = 1
    max_unavailable: int = 0
    stability_window_s: float | None = None
    steps: tuple[CanaryStep, ...] = ()
    max_failures: int = 2
    max_error_rate_increase: float = 0.01
    max_latency_ratio: float = 1.2
    min_requests: int = 20
    min_latency_samples: int = DEFAULT_MIN_LATENCY_SAMPLES

    @property
    def all_steps(self) -> tuple[CanaryStep, ...]:
        """The steps as they run: the implicit last step of every replica added."""
        if self.steps and self.steps[-1].replicas == ALL:
            return self.steps
        return (*self.steps, CanaryStep(replicas=ALL))


def rollout_policy_errors(policy: RolloutPolicy) -> list[SpecError]:
    """What is wrong with a rollout policy, by the name of each field in ``policy``."""
    errors: list[SpecError] = []
    need = need_into(errors)

    need(
        0 <= policy.max_surge <= MAX_REPLICAS, "max_surge", f"must be between 0 and {MAX_REPLICAS}"
    )
    need(
        0 <= policy.max_unavailable <= MAX_REPLICAS,
        "max_unavailable",
        f"must be between 0 and {MAX_REPLICAS}",
    )
    need(
        policy.max_surge > 0 or policy.max_unavailable > 0,
        "max_surge",
        "cannot be 0 while max_unavailable is 0 too: nothing could ever be replaced",
    )
    window = policy.stability_window_s
    need(
        window is None or 0 <= window <= MAX_STABILITY_WINDOW_S,
        "stability_window_s",
        f"must be between 0 and {MAX_STABILITY_WINDOW_S} (a day), or absent",
    )
    need(
        1 <= policy.max_failures <= MAX_ROLLOUT_FAILURES,
        "max_failures",
        f"must be between 1 and {MAX_ROLLOUT_FAILURES}",
    )
    need(
        0 <= policy.max_error_rate_increase <= 1,
        "max_error_rate_increase",
        "must be between 0 and 1 (a share of requests: 0.01 is one point)",
    )
    need(
        1 <= policy.max_latency_ratio <= MAX_LATENCY_RATIO,
        "max_latency_ratio",
        f"must be between 1 and {MAX_LATENCY_RATIO:g}",
    )
    need(
        1 <= policy.min_requests <= MAX_MIN_REQUESTS,
        "min_requests",
        f"must be between 1 and {MAX_MIN_REQUESTS}",
    )
    need(
        1 <= policy.min_latency_samples <= MAX_MIN_LATENCY_SAMPLES,
        "min_latency_samples",
        f"must be between 1 and {MAX_MIN_LATENCY_SAMPLES}",
    )
    need(
        len(policy.steps) <= MAX_CANARY_STEPS,
        "steps",
        f"has {len(policy.steps)} steps, more than {MAX_CANARY_STEPS}",
    )
    previous = 0
    for i, step in enumerate(policy.steps[:MAX_CANARY_STEPS]):
        field = f"steps[{i}]"
        if isinstance(step.replicas, int):
            count = step.replicas
            need(
                1 <= count <= MAX_REPLICAS,
                f"{field}.replicas",
                f'must be between 1 and {MAX_REPLICAS}, or "all"',
            )
            need(
                i == 0 or count > previous,
                f"{field}.replicas",
                "must be more than the step before: a rollout only goes forward",
            )
            previous = count
        else:
            need(i == len(policy.steps) - 1, f"{field}.replicas", '"all" must be the last step')
        need(
            step.traffic is None or 0 < step.traffic <= 1,
            f"{field}.traffic",
            "must be in (0, 1] (a share of the model's requests), or absent",
        )
        need(
            step.traffic is None or step.replicas != ALL,
            f"{field}.traffic",
            'cannot be set on a step of "all" replicas: there is no other revision left',
        )
        need(
            0 <= step.hold_s <= MAX_HOLD_S,
            f"{field}.hold_s",
            f"must be between 0 and {MAX_HOLD_S} (a week)",
        )
        need(
            step.hold_s <= 0 or step.replicas != ALL,
            f"{field}.hold_s",
            'cannot be set on a step of "all" replicas: the rollout finishes once every '
            "replica runs the new revision, with no replica of another left to judge a "
            "hold against",
        )
        need(
            not (step.hold_s > 0 and step.traffic == 1),
            f"{field}.traffic",
            "cannot be 1 on a step with a hold: the other revision would see no request to "
            "judge the step against",
        )
    return errors
