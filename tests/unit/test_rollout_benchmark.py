"""The rollout scenario of ``benchmarks/reconcile.py``, on a small fleet: its simulated
agents bring a rollout to its end, never serving fewer replicas than desired, so the
benchmark measures a rollout that really runs (and keeps working as the domain changes)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.domain.reconcile import Settings
from benchmarks.reconcile import EPOCH, T0, fleet
from benchmarks.rollout_scenario import CANARY, MODEL, run_rollout, with_model


@pytest.mark.parametrize("max_surge", [1, 4])
def test_the_benchmarks_rollout_replaces_every_replica_with_at_most_max_surge_moves(
    max_surge: int,
) -> None:
    state, view = fleet(nodes=20, replicas=40)
    view = with_model(state, view, replicas=16, at=T0)
    settings = Settings(epoch=EPOCH, started_at=T0 - timedelta(hours=1))

    run = run_rollout(state, view, T0 + timedelta(hours=1), settings, max_surge, max_passes=400)

    assert run.finished
    assert run.replaced == 16
    assert run.max_moves == max_surge
    assert run.traffic_wanted_ms, "the canary step held, and its verdict read the figures"
    assert run.simulated_s >= CANARY.hold_s
    assert len(run.pass_ms) == run.passes
    assert state.models[MODEL].revision == 1, "the fleet it started from is left as it was"
