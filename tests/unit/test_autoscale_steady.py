"""Stories of a steady demand exactly at what a number of replicas carries: the means are
sums over time in floating point, and a mean of a steady 12 may come out a hair above it;
the count must be the 3 replicas that 12 needs at 4 each, not 4."""

from __future__ import annotations

from datetime import timedelta

import hypothesis
from hypothesis import strategies as st

from app.domain import autoscale
from app.domain.autoscale import DemandSample
from tests.unit.test_autoscale import POLICY, T0, model


def steady(level: float, *, apart_s: float, seconds: float = 80.0) -> tuple[DemandSample, ...]:
    count = int(seconds / apart_s)
    return tuple(DemandSample(T0 + timedelta(seconds=apart_s * i), level) for i in range(count))


def test_a_steady_demand_of_exactly_three_replicas_keeps_three() -> None:
    samples = steady(12.0, apart_s=0.2)  # its mean over the passes sums to 12.000000000000227

    assert autoscale.decide(model(3), samples, samples[-1].at) is None


def test_a_steady_demand_of_exactly_three_replicas_takes_four_down_to_three() -> None:
    samples = steady(12.0, apart_s=0.7)

    decision = autoscale.decide(model(4), samples, samples[-1].at)

    assert decision is not None
    assert decision.replicas == 3


@hypothesis.given(
    replicas=st.integers(1, 8),
    apart_s=st.sampled_from([0.1, 0.2, 0.3, 0.7, 1.0, 1.1, 1.3]),
)
def test_a_steady_demand_needs_the_replicas_it_fills_exactly(replicas: int, apart_s: float) -> None:
    samples = steady(POLICY.target * replicas, apart_s=apart_s)

    assert autoscale.decide(model(replicas), samples, samples[-1].at) is None
