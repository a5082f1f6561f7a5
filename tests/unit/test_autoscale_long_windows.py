"""Stories of a policy with a long idle spell: a leader keeps a sample a pass for the whole
of ``idle_to_zero_s`` (up to a day: 86,400 samples a model at a pass a second), but the
means that move the count look back only ``up_window_s + down_window_s``, and a pass must
not grow with the idle spell it waits for."""

from __future__ import annotations

from datetime import timedelta

import pytest
from msgspec.structs import replace

from app.domain import autoscale
from app.domain.autoscale import DemandSample
from tests.unit.test_autoscale import POLICY, T0, model

DAY_S = 86_400
DAY = replace(POLICY, min_replicas=0, up_window_s=10.0, down_window_s=60.0, idle_to_zero_s=DAY_S)


def a_day(demand: float, *, busy_at: int | None = None) -> tuple[DemandSample, ...]:
    """A sample a second for a day and a little more, each ``demand`` but the one at
    ``busy_at`` seconds, which is 3."""
    return tuple(
        DemandSample(T0 + timedelta(seconds=i), 3.0 if i == busy_at else demand)
        for i in range(DAY_S + 3)
    )


@pytest.fixture
def timeline_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many samples each timeline a decision builds is made of."""
    sizes: list[int] = []
    built = autoscale._Timeline

    def counting(samples: tuple[DemandSample, ...]) -> autoscale._Timeline:
        sizes.append(len(samples))
        return built(samples)

    monkeypatch.setattr(autoscale, "_Timeline", counting)
    return sizes


def test_a_pass_builds_the_means_from_the_windows_samples_not_the_idle_spell_s(
    timeline_sizes: list[int],
) -> None:
    samples = a_day(6.0)

    decision = autoscale.decide(model(1, DAY), samples, samples[-1].at)

    assert decision is not None
    assert decision.replicas == 2
    assert timeline_sizes
    assert max(timeline_sizes) <= 60 + 10 + 2  # the windows' seconds, a sample before


def test_a_day_without_demand_takes_the_last_replica_away() -> None:
    samples = a_day(0.0)

    decision = autoscale.decide(model(1, DAY), samples, samples[-1].at)

    assert decision is not None
    assert (decision.replicas, decision.reason) == (0, f"no demand for {DAY_S}s")


def test_one_request_early_in_the_day_keeps_the_last_replica() -> None:
    samples = a_day(0.0, busy_at=100)

    assert autoscale.decide(model(1, DAY), samples, samples[-1].at) is None


def test_a_gap_in_the_passes_early_in_the_day_keeps_the_last_replica() -> None:
    samples = list(a_day(0.0))
    samples[1000] = replace(samples[1000], stands_for_s=0.1)  # 0.9 s unknown, thrice
    samples[2000] = replace(samples[2000], stands_for_s=0.1)
    samples[3000] = replace(samples[3000], stands_for_s=0.1)

    assert autoscale.decide(model(1, DAY), samples, samples[-1].at) is None
