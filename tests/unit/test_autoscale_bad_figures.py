"""Stories of a per-replica load too small to divide by: the spec refuses a ``target`` or a
``capacity`` below a hundredth, and a log written before it did, which may hold one (or a
bench capacity of next to nothing), holds the model's count and says why, while the
reconcile pass goes on for every other model."""

from __future__ import annotations

from datetime import timedelta

import pytest
from msgspec.structs import replace

from app.domain import autoscale
from app.domain.events import ModelScaled, ReplicaPlaced
from app.domain.model_spec import AutoscalePolicy, ModelSpec, validate_spec
from tests.unit.test_autoscale import POLICY, T0, model
from tests.unit.test_reconcile import of_type, with_two_nodes_and_a_model


def errors_of(policy: AutoscalePolicy) -> list[tuple[str, str]]:
    spec = ModelSpec(name="llama", command="sim --port {port}", autoscale=policy)
    return [(e.field, e.reason) for e in validate_spec(spec)]


@pytest.mark.parametrize("target", [5e-324, 1e-320, 0.009, 0.0])
def test_a_target_below_a_hundredth_of_a_request_is_refused(target: float) -> None:
    assert errors_of(replace(POLICY, target=target)) == [
        ("autoscale.target", "must be between 0.01 and 100000 (requests a replica carries)")
    ]


@pytest.mark.parametrize("capacity", [1e-200, 0.009, 0.0])
def test_a_capacity_below_a_hundredth_of_the_benched_one_is_refused(capacity: float) -> None:
    assert errors_of(replace(POLICY, capacity=capacity)) == [
        (
            "autoscale.capacity",
            "must be between 0.01 and 1 (a share of the capacity bench measured), or absent",
        )
    ]


def test_the_least_target_and_capacity_are_accepted() -> None:
    assert errors_of(replace(POLICY, target=0.01, capacity=0.01)) == []


def test_a_tiny_target_from_an_older_log_holds_the_count_and_says_why() -> None:
    # Recorded before the bound: the fold takes the log as it is.
    llama = model(2, replace(POLICY, target=5e-324))
    samples = (autoscale.DemandSample(T0, 30.0),)

    decision = autoscale.decide(llama, samples, T0 + timedelta(seconds=0.5))

    assert decision is not None
    assert decision.replicas == 2
    assert decision.reason == (
        "the count holds: 4.94066e-324 per replica (target 4.94066e-324) is not a load to "
        "scale by (at least 0.01)"
    )


@pytest.mark.parametrize(
    ("share", "capacity", "said"),
    [
        (0.5, 1e-200, "5e-201 per replica (0.5 of the capacity bench measured (1e-200 "),
        (1e-200, 1e-200, "0 per replica (1e-200 of the capacity bench measured (1e-200 "),
        (0.5, 10**400, "inf per replica (0.5 of the capacity bench measured (inf "),
    ],
)
def test_a_bench_capacity_from_an_older_log_that_gives_no_count_holds_it(
    share: float, capacity: float, said: str
) -> None:
    llama = model(3, replace(POLICY, capacity=share), capacity=capacity)
    idle = (autoscale.DemandSample(T0, 0.0),)  # no demand at all: the load divides zero

    decision = autoscale.decide(llama, idle, T0)

    assert decision is not None
    assert decision.replicas == 3
    assert decision.reason.startswith(f"the count holds: {said}")


def test_a_model_whose_load_gives_no_count_does_not_stop_the_pass_for_the_others() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1, autoscale=replace(POLICY, target=5e-324))
    cluster.model("qwen", replicas=2)
    cluster.demand = autoscale.observe(
        {}, {"llama": 12.0}, cluster.state.models, cluster.now, pass_interval_s=1.0
    )

    decision = cluster.reconcile()

    assert of_type(decision, ModelScaled) == []  # a count that holds records nothing
    placed = sorted(e.replica_id for e in of_type(decision, ReplicaPlaced))
    assert placed == ["llama-1", "qwen-1", "qwen-2"]
