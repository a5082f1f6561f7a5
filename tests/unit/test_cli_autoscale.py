"""How ``llmgw-cli`` words a model's autoscaling: the policy in a line, its count with its
bounds, and why it is short in one phrase."""

from __future__ import annotations

from cyclopts.argument import Argument
from msgspec.structs import replace

from app.domain.model_spec import (
    MAX_AUTOSCALE_TARGET,
    MIN_AUTOSCALE_CAPACITY,
    MIN_AUTOSCALE_TARGET,
)
from cli.arguments import NumberWithin
from cli.autoscale import inputs_text, policy_text
from cli.main import app
from cli.models import count_text, shortfall_text
from cli.views import (
    AutoscaleDecisionView,
    AutoscaleView,
    ModelSpecView,
    ModelView,
    ScaleInputsView,
)

UNPLACEABLE = "needs 1 node(s) with 2 healthy free GPU(s), 0 eligible of 3: 3 not enough GPUs"
SHORT = ModelView(
    name="llama",
    desired=8,
    serving=4,
    counting=5,
    unplaceable_reason=UNPLACEABLE,
    below_desired_because=[
        f"cannot place 3 replica(s): {UNPLACEABLE}",
        "1 replica(s) placed or starting, not serving yet",
    ],
    spec=ModelSpecView(autoscale=AutoscaleView(min_replicas=1, max_replicas=8)),
)


def test_a_model_no_node_can_take_says_what_it_wants_what_it_has_and_why() -> None:
    assert shortfall_text(SHORT) == f"wants 8, has 5: {UNPLACEABLE}"
    assert count_text(SHORT) == "4/8 (auto 1..8)"


def test_once_every_replica_is_placed_the_first_reason_stands_for_them_all() -> None:
    # The unplaceable reason is the reconciler's last word, kept after a node freed up.
    placed = replace(
        SHORT,
        counting=8,
        below_desired_because=[
            "4 replica(s) placed or starting, not serving yet",
            "1 failure (a start that failed or an engine that crashed within 60s of "
            "serving): llama-3 failed",
        ],
    )

    assert shortfall_text(placed) == "4 replica(s) placed or starting, not serving yet"


def test_a_model_at_its_count_says_nothing_and_a_manual_one_shows_no_bounds() -> None:
    full = replace(SHORT, serving=8, counting=8, below_desired_because=[])
    manual = replace(full, spec=ModelSpecView())

    assert shortfall_text(full) == ""
    assert count_text(manual) == "8/8"


def test_the_policy_names_its_load_per_replica_and_scale_to_zero_only_when_it_may() -> None:
    by_target = AutoscaleView(min_replicas=2, max_replicas=6, target=3)
    by_capacity = AutoscaleView(min_replicas=0, max_replicas=4, capacity=0.75, max_step=1)

    assert policy_text(by_target) == (
        "2..6 replicas, 3 requests per replica, up on the 10s average, down after 300s "
        "below, at most 4 a step"
    )
    assert policy_text(by_capacity) == (
        "0..4 replicas, 75% of the benched capacity per replica (4 requests without a bench "
        "result), up on the 10s average, down after 300s below, at most 1 a step, to zero "
        "after 900s idle (a cold start holds requests up to 300s)"
    )


def test_the_policy_says_when_a_deeper_drop_waits_less_than_the_down_window() -> None:
    quicker = AutoscaleView(min_replicas=1, max_replicas=10, down_window_min_share=0.5)

    assert policy_text(quicker) == (
        "1..10 replicas, 4 requests per replica, up on the 10s average, down after 300s "
        "below, at most 4 a step (a deeper drop after 50% of it at least)"
    )


def test_a_scale_down_s_inputs_say_how_long_it_waited_and_the_peak_over_that_wait() -> None:
    seen = ScaleInputsView(
        demand=4,
        per_replica=4,
        per_replica_from="target 4",
        up_window_mean=4,
        down_window_max=28,
        samples=61,
        down_wait_s=30,
        down_wait_max=10.545,
    )

    assert inputs_text(AutoscaleDecisionView(replicas=3, previous=7, inputs=seen)) == (
        "demand 4, 4 per replica (target 4), up-window mean 4.0, down-window peak 28.0, "
        "peak 10.5 over the 30s waited, 61 samples"
    )


def _option(name: str) -> Argument:
    (argument,) = [a for a in app["autoscale"].assemble_argument_collection() if a.name == name]
    return argument


def _number_bounds(argument: Argument) -> NumberWithin:
    number = argument.parameter.converter
    assert isinstance(number, NumberWithin)
    return number


def test_the_cli_checks_target_and_capacity_against_the_specs_own_bounds() -> None:
    """The CLI cannot import the domain: its bounds are written again, and must agree."""
    target, capacity = _option("--target"), _option("--capacity")

    assert _number_bounds(target).low == MIN_AUTOSCALE_TARGET
    assert f"{MIN_AUTOSCALE_TARGET:g} to {MAX_AUTOSCALE_TARGET:g}" in str(target.parameter.help)
    assert (_number_bounds(capacity).low, _number_bounds(capacity).high) == (
        MIN_AUTOSCALE_CAPACITY,
        1,
    )
    assert f"share ({MIN_AUTOSCALE_CAPACITY:g} to 1)" in str(capacity.parameter.help)
