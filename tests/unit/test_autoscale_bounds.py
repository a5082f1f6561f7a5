"""Stories of an autoscaled model's bounds holding while the autoscaler hears no demand:
``max`` is the model's cap on the fleet, and an operator who lowers it (or declares a count
above it) must see the count come within it even while no gateway reports."""

from __future__ import annotations

from msgspec.structs import replace

from app.domain import autoscale
from app.domain.events import ModelScaled, ReplicaPlaced
from app.domain.model_spec import ModelSpec, validate_spec
from tests.unit.test_autoscale import POLICY, T0, Demand, model
from tests.unit.test_reconcile import of_type, with_two_nodes_and_a_model


def test_a_count_above_a_lowered_max_comes_down_to_it_while_no_gateway_reports() -> None:
    demand = Demand(model(8, replace(POLICY, max_replicas=2)))

    held = demand.silent(1)

    assert held is not None
    assert (held.replicas, held.reason) == (2, "held to max 2 (no demand heard)")
    assert held.inputs is None


def test_a_count_below_a_raised_min_comes_up_to_it_while_no_gateway_reports() -> None:
    demand = Demand(model(1, replace(POLICY, min_replicas=3)))

    held = demand.silent(1)

    assert held is not None
    assert (held.replicas, held.reason) == (3, "held to min 3 (no demand heard)")


def test_a_count_within_its_bounds_holds_while_no_gateway_reports() -> None:
    demand = Demand(model(7, replace(POLICY, min_replicas=0)))

    assert demand.silent(300) is None


def test_a_declared_count_above_max_is_not_placed_before_any_gateway_reports() -> None:
    # The spec's ``replicas`` is where the count starts, and is not checked against the
    # policy's bounds: a file with ``replicas: 6`` and ``max: 2`` is accepted.
    policy = replace(POLICY, max_replicas=2)
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=6, autoscale=policy)
    assert validate_spec(spec) == []
    cluster = with_two_nodes_and_a_model(replicas=6, autoscale=policy)
    cluster.demand = autoscale.observe(
        {}, None, cluster.state.models, cluster.now, pass_interval_s=1.0
    )

    decision = cluster.reconcile()

    [scaled] = of_type(decision, ModelScaled)
    assert (scaled.previous, scaled.replicas) == (6, 2)
    assert len(of_type(decision, ReplicaPlaced)) == 2


def test_a_count_above_max_comes_down_to_it_when_the_per_replica_load_is_unusable() -> None:
    # A target from a log written before the spec's bound on it: no count to scale to, but
    # ``max`` needs none.
    llama = model(8, replace(POLICY, target=5e-324, max_replicas=2))
    samples = (autoscale.DemandSample(T0, 30.0),)

    held = autoscale.decide(llama, samples, T0)

    assert held is not None
    assert held.replicas == 2
    assert held.reason == (
        "held to max 2 (4.94066e-324 per replica (target 4.94066e-324) is not a load to "
        "scale by (at least 0.01))"
    )
    assert held.inputs is None


def test_a_count_below_min_comes_up_to_it_when_the_per_replica_load_is_unusable() -> None:
    llama = model(1, replace(POLICY, capacity=0.5, min_replicas=3), capacity=10**400)
    idle = (autoscale.DemandSample(T0, 0.0),)

    held = autoscale.decide(llama, idle, T0)

    assert held is not None
    assert held.replicas == 3
    assert held.reason.startswith("held to min 3 (inf per replica")
