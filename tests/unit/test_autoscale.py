"""Stories of autoscaling on a fixed clock: demand sampled every pass moves the replica
count up at once, down only after a window of lower demand, never outside the bounds, to
zero after an idle spell and back with the first request."""

from __future__ import annotations

from datetime import datetime, timedelta

import hypothesis
import pytest
from hypothesis import strategies as st
from msgspec.structs import replace

from app.domain import autoscale
from app.domain import model_operations as model_ops
from app.domain.autoscale import DemandSample, ScaleDecision
from app.domain.events import ModelDeclared, ModelScaled, ModelTuned
from app.domain.model_spec import (
    AutoscalePolicy,
    CanaryStep,
    ModelSpec,
    RolloutPolicy,
    validate_spec,
)
from app.domain.operation_results import InvalidOperation, InvalidSpec
from app.domain.state import ClusterState, Model
from tests.unit.test_domain_operations import given
from tests.unit.test_reconcile import of_type, with_two_nodes_and_a_model

T0 = datetime(2026, 12, 2, 14, 0, 0)
PASS_INTERVAL_S = 1.0
POLICY = AutoscalePolicy(
    min_replicas=1,
    max_replicas=8,
    target=4.0,
    up_window_s=10.0,
    down_window_s=60.0,
    idle_to_zero_s=120.0,
    max_step=4,
)


def model(replicas: int, policy: AutoscalePolicy = POLICY, **tuned: object) -> Model:
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=replicas, autoscale=policy)
    events: list[object] = [ModelDeclared(model="llama", spec=spec)]
    if tuned:
        events.append(
            ModelTuned(model="llama", weight=1.0, target_waiting=5, kv_ceiling=0.8, summary=tuned)
        )
    return given(*events).models["llama"]  # type: ignore[arg-type]


class Demand:
    """Samples taken every second, as the reconciler's passes would."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.now = T0
        self.history: dict[str, tuple[DemandSample, ...]] = {}

    def seconds(self, n: int, demand: float, *, partial: bool = False) -> ScaleDecision | None:
        """``n`` passes a second apart at ``demand`` (``partial``: while some gateway is
        silent); the first decision that changed the count, or None (each is applied to the
        model as the log would)."""
        return self.passes(n, demand, apart_s=1.0, partial=partial)

    def passes(
        self, n: int, demand: float, *, apart_s: float, partial: bool = False
    ) -> ScaleDecision | None:
        """As ``seconds``, ``apart_s`` apart."""
        changed = None
        for _ in range(n):
            self.now += timedelta(seconds=apart_s)
            models = {"llama": self.model}
            self.history = autoscale.observe(
                self.history,
                {"llama": demand},
                models,
                self.now,
                pass_interval_s=PASS_INTERVAL_S,
                partial=partial,
            )
            decision = autoscale.decide(self.model, self.history["llama"], self.now)
            if decision is not None:
                spec = replace(self.model.spec, replicas=decision.replicas)
                self.model = replace(self.model, spec=spec)
                changed = changed or decision
        return changed

    def silent(self, n: int) -> ScaleDecision | None:
        """``n`` passes a second apart that hear from no gateway; the first decision, if
        any (none is applied)."""
        changed = None
        for _ in range(n):
            self.now += timedelta(seconds=1)
            models = {"llama": self.model}
            self.history = autoscale.observe(
                self.history, None, models, self.now, pass_interval_s=PASS_INTERVAL_S
            )
            samples = self.history["llama"]
            changed = changed or autoscale.decide(self.model, samples, self.now)
        return changed or None

    def no_pass(self, seconds: float) -> None:
        """``seconds`` in which the leader runs no pass (its database out of reach, a
        stall) while the gateways go on reporting."""
        self.now += timedelta(seconds=seconds)

    @property
    def replicas(self) -> int:
        return self.model.spec.replicas


def test_a_step_of_load_scales_up_within_the_up_window_by_at_most_max_step_a_decision() -> None:
    demand = Demand(model(1))
    demand.seconds(70, 2.0)
    assert demand.replicas == 1

    first = demand.seconds(1, 30.0)

    assert first is not None
    assert first.replicas == 2  # the average over 10 s is (9 x 2 + 30) / 10 = 4.8
    demand.seconds(10, 30.0)
    assert demand.replicas == 8  # 30 / 4 needs 8: capped by max, reached in steps of 4


def test_a_burst_shorter_than_the_window_moves_the_average_only_by_its_share() -> None:
    demand = Demand(model(2))
    demand.seconds(70, 4.0)

    demand.seconds(1, 12.0)  # one second at 12: the ten-second average is 4.8

    assert demand.replicas == 2


def test_passes_close_together_count_for_the_time_they_cover_not_once_each() -> None:
    demand = Demand(model(2))
    demand.seconds(70, 6.0)

    # A scale event wakes ten passes within a tenth of a second, each taking the gateways'
    # latest reports again: 20 for that moment. Over the ten seconds they weigh 0.1 s, so
    # the average is 6.14 and 2 replicas still carry it. Counted once each, they would have
    # lifted it to 8.3 at the first of them (3 replicas) and to 13 by the tenth (4).
    assert demand.passes(10, 20.0, apart_s=0.01) is None
    assert demand.replicas == 2

    # The same demand held for the whole window is taken at its full weight: 20 needs 5.
    assert demand.seconds(10, 20.0) is not None
    assert demand.replicas == 5


def test_the_count_comes_down_only_after_a_whole_window_of_lower_demand() -> None:
    demand = Demand(model(1))
    demand.seconds(15, 28.0)
    assert demand.replicas == 7

    assert demand.seconds(61, 4.0) is None  # the window still holds the peak's averages
    assert demand.replicas == 7
    first = demand.seconds(1, 4.0)

    # Then the ten-second averages that mixed the peak with what followed leave the window
    # one by one, and the count follows them down until only averages of 4 are left.
    assert first is not None
    assert first.replicas == 6
    assert first.reason == "demand averaged at most 23.2 over 60s needs 6 replica(s) at 4 each"
    assert first.inputs is not None
    assert first.inputs.down_window_max == pytest.approx((8 * 28 + 2 * 4) / 10)
    last = first
    while demand.replicas > 1:
        last = demand.seconds(1, 4.0) or last
    assert last.reason == "demand averaged at most 4.0 over 60s needs 1 replica(s) at 4 each"
    assert demand.now - T0 == timedelta(seconds=15 + 70)  # ten seconds and a minute after


def test_a_signal_swinging_across_a_threshold_does_not_flap() -> None:
    demand = Demand(model(1))
    counts = []
    for _ in range(40):
        demand.seconds(3, 13.0)  # the samples swing between 13 and 1 (3 or 1 replicas);
        demand.seconds(3, 1.0)  # their ten-second averages between 5.8 and 8.2 (2 or 3)
        counts.append(demand.replicas)

    # The first seconds alone averaged 13 (4 replicas). Once they have left the minute's
    # window the count comes down to the 3 that the averages' peaks need, and stays there,
    # where the latest sample alone would take it to 4 and back to 1 every few seconds.
    assert counts == [4] * 10 + [3] * 30


def test_the_count_stays_inside_its_bounds_and_is_brought_back_into_them() -> None:
    bounded = replace(POLICY, min_replicas=2, max_replicas=3)
    demand = Demand(model(1, bounded))

    first = demand.seconds(1, 0.0)
    assert first is not None
    assert (first.replicas, first.reason) == (2, "held to min 2")
    demand.seconds(20, 100.0)
    assert demand.replicas == 3


def test_a_model_without_demand_goes_to_zero_after_its_idle_spell_and_back_at_once() -> None:
    policy = replace(POLICY, min_replicas=0)
    demand = Demand(model(1, policy))

    demand.seconds(100, 0.0)
    assert demand.replicas == 1  # down window over, idle spell not yet
    gone = demand.seconds(30, 0.0)
    assert gone is not None
    assert (gone.replicas, gone.reason) == (0, "no demand for 120s")

    back = demand.seconds(1, 1.0)  # one request held by a gateway

    assert back is not None
    assert (back.replicas, back.reason) == (1, "demand 1 for a model with no replica")


def test_gateways_gone_silent_are_not_read_as_demand_gone() -> None:
    demand = Demand(model(1, replace(POLICY, min_replicas=0)))
    demand.seconds(15, 28.0)
    assert demand.replicas == 7

    # No gateway reports for five minutes (a database they cannot reach, a stalled one):
    # past the down window and the idle spell, the count holds where a zero would have
    # taken it to nothing.
    assert demand.silent(300) is None
    assert demand.history["llama"] == ()  # the old samples aged out, none was added
    # Heard again, the count still waits a whole window before it comes down.
    assert demand.seconds(50, 4.0) is None
    assert demand.replicas == 7
    assert demand.seconds(10, 4.0) is not None
    assert demand.replicas < 7


def test_a_silence_is_not_read_as_the_last_demand_heard_going_on() -> None:
    demand = Demand(model(1))
    demand.seconds(15, 28.0)
    demand.seconds(40, 4.0)  # lower, but not yet for the whole window
    assert demand.replicas == 7

    # Silent for half a minute: the last samples heard would say 1 replica once the peak's
    # leave the window; what the demand did meanwhile is unknown, so the count holds.
    assert demand.silent(30) is None


def test_the_first_report_after_a_silence_does_not_stand_for_the_time_nobody_reported() -> None:
    demand = Demand(model(1, replace(POLICY, min_replicas=0)))
    demand.seconds(15, 28.0)
    assert demand.replicas == 7

    # No gateway reports for 90 s: longer than the down window, shorter than the idle
    # spell the samples are kept for. The first report after it says nothing of the 90 s,
    # so it may not stand for them: the count waits a whole window of what is heard.
    assert demand.silent(90) is None
    assert demand.seconds(55, 4.0) is None
    assert demand.replicas == 7
    assert demand.seconds(10, 4.0) is not None
    assert demand.replicas < 7


def test_a_gap_in_the_leader_s_passes_is_not_read_as_the_demand_after_it_going_on() -> None:
    demand = Demand(model(1))
    demand.seconds(15, 28.0)
    demand.seconds(40, 4.0)  # lower, but not yet for the whole window
    assert demand.replicas == 7

    # The leader runs no pass for half a minute. The first sample after it says what the
    # demand is now, not what it was meanwhile: it stands for one pass interval, and the
    # half minute is unknown, so no drop is decided on it.
    demand.no_pass(30)
    assert demand.seconds(1, 4.0) is None
    assert demand.replicas == 7
    # Down once the gap has left the window: a whole minute of samples after it.
    assert demand.seconds(55, 4.0) is None
    assert demand.seconds(5, 4.0) is not None
    assert demand.replicas < 7


def test_a_leader_s_clock_stepped_back_is_read_as_a_start_not_as_time_gone_by() -> None:
    """The leader's clock steps back an hour (a wrong time corrected): the samples it took
    before are later than any it takes now, so they say nothing of the window before now.
    The count goes up at once as after a start, and down only once a whole window of
    samples after the step says so; nothing it took before decides, in either direction."""
    demand = Demand(model(1))
    demand.seconds(90, 28.0)
    assert demand.replicas == 7

    demand.no_pass(-3600)
    assert demand.seconds(1, 4.0) is None
    assert demand.history["llama"] == (DemandSample(demand.now, 4.0),)
    assert demand.seconds(55, 4.0) is None
    assert demand.replicas == 7
    assert demand.seconds(10, 4.0) is not None
    assert demand.replicas < 7

    demand.no_pass(-3600)
    assert demand.seconds(5, 80.0) is not None  # the ten-second average is 40
    assert demand.replicas == 8


def test_a_gap_in_the_leader_s_passes_is_not_read_as_an_idle_spell() -> None:
    demand = Demand(model(1, replace(POLICY, min_replicas=0)))
    demand.seconds(100, 1.0)
    demand.seconds(10, 0.0)
    assert demand.replicas == 1

    # No pass for 110 s, then a sample of no demand: the idle spell of 120 s would hold
    # nothing but zeros if that sample stood for the gap. It stands for a second of it.
    demand.no_pass(110)
    assert demand.seconds(1, 0.0) is None
    assert demand.replicas == 1
    # To zero once a whole idle spell after the gap has been watched.
    assert demand.seconds(110, 0.0) is None
    gone = demand.seconds(10, 0.0)
    assert gone is not None
    assert (gone.replicas, gone.reason) == (0, "no demand for 120s")


def test_a_gap_in_the_leader_s_passes_is_not_read_as_demand() -> None:
    demand = Demand(model(1, replace(POLICY, up_window_s=30.0)))
    demand.seconds(70, 2.0)

    # After 20 s without a pass, one sample at 12. Standing for the 20 s it would make the
    # 30 s average (9 x 2 + 21 x 12) / 30 = 9 (3 replicas); it stands for one second of
    # what is known, (9 x 2 + 12) / 10 = 3, as a burst of a second moves an average.
    demand.no_pass(20)
    assert demand.seconds(1, 12.0) is None
    assert demand.replicas == 1
    # The demand that goes on at 12 is known soon enough: up within seconds.
    assert demand.seconds(10, 12.0) is not None
    assert demand.replicas == 3


def test_a_pass_a_few_intervals_late_still_stands_for_the_time_since_the_one_before() -> None:
    demand = Demand(model(1))
    demand.seconds(70, 0.0)

    # Three seconds after the pass before it (three pass intervals): a late pass, not a
    # gap. The ten-second average is 3 x 20 / 10 = 6: 2 replicas.
    up = demand.passes(1, 20.0, apart_s=3.0)

    assert up is not None
    assert up.replicas == 2


def test_a_silent_gateway_holds_the_count_from_coming_down_but_not_from_going_up() -> None:
    demand = Demand(model(1))
    demand.seconds(15, 28.0)
    assert demand.replicas == 7

    # One gateway of several stops reporting (stalled, cut off from the database): the
    # others' requests are a floor of the demand. Low for two windows, it proves nothing.
    assert demand.seconds(120, 4.0, partial=True) is None
    assert demand.replicas == 7
    # High, it is at least that high: up at once.
    up = demand.seconds(10, 40.0, partial=True)
    assert up is not None
    assert demand.replicas == 8
    # Every gateway heard again: down once a whole window holds no partial sample.
    assert demand.seconds(55, 4.0) is None
    assert demand.replicas == 8
    assert demand.seconds(10, 4.0) is not None
    assert demand.replicas < 8


def test_a_silent_gateway_keeps_an_idle_model_from_going_to_zero() -> None:
    demand = Demand(model(1, replace(POLICY, min_replicas=0)))
    demand.seconds(300, 0.0, partial=True)
    assert demand.replicas == 1

    # Heard whole again: the idle spell counts from there, not from the partial samples.
    demand.seconds(100, 0.0)
    assert demand.replicas == 1
    demand.seconds(30, 0.0)
    assert demand.replicas == 0


def test_a_control_plane_that_just_started_scales_up_but_not_down() -> None:
    demand = Demand(model(6))

    assert demand.seconds(30, 1.0) is None
    assert demand.seconds(5, 80.0) is not None  # the ten-second average is 40.5
    assert demand.replicas == 8


def test_a_window_of_a_few_seconds_is_watched_whole_before_the_count_goes_down() -> None:
    short = replace(POLICY, min_replicas=0, down_window_s=3.0, idle_to_zero_s=3.0)
    llama = model(1, short)
    history: dict[str, tuple[DemandSample, ...]] = {}
    now, first_sample, gone_at = T0, T0 + timedelta(seconds=0.2), None
    while gone_at is None and now < T0 + timedelta(seconds=10):
        now += timedelta(seconds=0.2)  # passes five times a second, none with demand
        history = autoscale.observe(history, {}, {"llama": llama}, now, pass_interval_s=0.2)
        decision = autoscale.decide(llama, history["llama"], now)
        if decision is not None:
            assert decision.replicas == 0, decision
            gone_at = now

    # Watched for at least 2.7 s of the 3 s (a tenth of a window may be missed, never
    # two seconds of three).
    assert gone_at is not None
    assert gone_at - first_sample >= timedelta(seconds=2.7)


def test_the_target_is_a_share_of_the_benched_capacity_when_bench_measured_one() -> None:
    policy = replace(POLICY, capacity=0.5)
    benched = model(1, policy, capacity=16, source="llmgw-cli bench")

    load, said = autoscale.per_replica_load(benched, policy)
    assert (load, said) == (8.0, "0.5 of the capacity bench measured (16 concurrent)")
    assert autoscale.per_replica_load(model(1, policy), policy) == (
        4.0,
        "target 4 (no bench result to take a share of)",
    )
    demand = Demand(benched)
    demand.seconds(12, 20.0)
    assert demand.replicas == 3  # 20 / 8


def test_demand_is_in_flight_on_the_model_s_replicas_plus_what_is_held_queued_for_it() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    state: ClusterState = cluster.state

    demand = autoscale.demand_by_model(
        state, {"llama-1": 3, "llama-2": 2, "gone-9": 7}, {"llama": 1, "other": 4}
    )

    assert demand == {"llama": 6.0, "other": 4.0}


def test_the_reconciler_records_the_autoscaler_s_change_with_its_inputs() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1, autoscale=POLICY)
    history = autoscale.observe(
        {}, {"llama": 12.0}, cluster.state.models, cluster.now, pass_interval_s=1.0
    )
    cluster.demand = history

    decision = cluster.reconcile()

    [scaled] = of_type(decision, ModelScaled)
    assert (scaled.previous, scaled.replicas) == (1, 3)
    assert scaled.inputs is not None
    assert scaled.inputs.demand == 12.0
    [planned] = [p for p in decision.events if isinstance(p.event, ModelScaled)]
    assert planned.actor == "autoscaler"
    assert len(cluster.state.replicas) == 3  # placed in the same pass


def test_an_autoscaled_model_refuses_a_manual_scale_and_keeps_its_count_on_re_apply() -> None:
    spec = ModelSpec(name="llama", command="sim --port {port}", replicas=1, autoscale=POLICY)
    state = given(
        ModelDeclared(model="llama", spec=spec),
        ModelScaled(model="llama", replicas=5, previous=1, reason="demand"),
    )

    with pytest.raises(InvalidOperation, match="autoscaled between 1 and 8"):
        model_ops.scale(state, "llama", 2)
    assert model_ops.apply_model(state, spec).events == ()
    off = model_ops.set_autoscale(state, "llama", None)
    [declared] = off.events
    assert isinstance(declared, ModelDeclared)
    assert (declared.spec.autoscale, declared.spec.replicas, declared.revision) == (None, 5, 1)


def test_autoscaling_turns_off_at_a_count_no_larger_than_a_held_canary_step() -> None:
    """The autoscaler took the model down to one replica, as many as its canary step
    brings up: off, the count stays, as a scale to it would have left it, rather than the
    operator being told of a step they did not touch and kept from turning it off."""
    canary = RolloutPolicy(steps=(CanaryStep(replicas=1, traffic=0.05, hold_s=600),))
    spec = ModelSpec(
        name="llama", command="sim --port {port}", replicas=3, autoscale=POLICY, rollout=canary
    )
    state = given(
        ModelDeclared(model="llama", spec=spec),
        ModelScaled(model="llama", replicas=1, previous=3, reason="demand"),
    )

    off = model_ops.set_autoscale(state, "llama", None)

    [declared] = off.events
    assert isinstance(declared, ModelDeclared)
    assert (declared.spec.autoscale, declared.spec.replicas) == (None, 1)


OLDER_RELEASES_SPECS = {
    "a secret inline": {"env": {"HF_TOKEN": "hf_recorded_before_the_rule"}},
    "--port twice": {
        "engine": "llamacpp",
        "command": "llama-server -m {model} --port {port} --port 8080",
    },
}


@pytest.mark.parametrize("refused_now", sorted(OLDER_RELEASES_SPECS))
def test_a_spec_an_older_release_recorded_is_refused_on_apply_but_its_count_stays_movable(
    refused_now: str,
) -> None:
    """Applied, a spec is a new declaration and meets today's rules, even one that changes
    only the count; the recorded spec stays in use meanwhile, and whoever runs it can still
    move its count: by ``scale``, or by autoscaling it, changing its bounds or turning it
    off."""
    autoscaled = ModelSpec(name="llama", command="sim --port {port}", replicas=2, autoscale=POLICY)
    recorded = replace(autoscaled, **OLDER_RELEASES_SPECS[refused_now])
    assert validate_spec(recorded)  # refused today
    state = given(ModelDeclared(model="llama", spec=recorded))

    with pytest.raises(InvalidSpec) as refused:
        model_ops.apply_model(state, replace(recorded, replicas=3))
    raised = model_ops.patch_autoscale(state, "llama", {"max": 12})
    off = model_ops.set_autoscale(state, "llama", None)
    with pytest.raises(InvalidSpec) as bad_policy:
        model_ops.patch_autoscale(state, "llama", {"min": 20})

    assert str(refused.value).endswith(
        "nothing was recorded. Model llama runs a spec recorded before these rules, which "
        "stays in use until a spec that meets them is applied; meanwhile its count is changed "
        "by `llmgw-cli scale llama N` (or `llmgw-cli autoscale llama` when it is autoscaled)"
    )
    assert validate_spec(recorded)[0] in refused.value.errors  # why, and how to mend it
    [declared] = raised.events
    assert isinstance(declared, ModelDeclared)
    assert declared.spec == replace(recorded, autoscale=replace(POLICY, max_replicas=12))
    [manual] = off.events
    assert isinstance(manual, ModelDeclared)
    assert manual.spec == replace(recorded, autoscale=None)
    assert [(e.field, e.reason) for e in bad_policy.value.errors] == [
        (
            "autoscale.min",
            f"20 is above the model's max ({POLICY.max_replicas}), which this change keeps: "
            "change max with it",
        )
    ]
    with pytest.raises(InvalidSpec) as new_model_refused:
        model_ops.apply_model(state, replace(recorded, name="mistral"))
    assert str(new_model_refused.value).endswith("nothing was recorded")
    assert model_ops.scale(given(manual), "llama", 5).events == (
        ModelScaled(model="llama", replicas=5, previous=2),
    )


def test_a_policy_out_of_bounds_is_refused_field_by_field() -> None:
    bad = AutoscalePolicy(min_replicas=5, max_replicas=2, target=0, capacity=1.5, max_step=0)
    spec = ModelSpec(name="llama", command="sim --port {port}", autoscale=bad)

    assert [e.field for e in validate_spec(spec)] == [
        "autoscale.max",
        "autoscale.target",
        "autoscale.capacity",
        "autoscale.max_step",
    ]


SHARE = replace(POLICY, down_window_min_share=0.5)


def test_a_deeper_drop_waits_only_its_share_of_the_down_window() -> None:
    whole, share = Demand(model(1)), Demand(model(1, SHARE))
    for demand in (whole, share):
        demand.seconds(15, 28.0)  # 7 replicas
        demand.seconds(36, 4.0)  # a fall to what one replica carries
    assert (whole.replicas, share.replicas) == (7, 7)

    first = share.seconds(1, 4.0)

    # 7 to 3 (max_step 4) waits 3/7 of the minute, raised to half of it: 30 s in which no
    # ten-second mean needed more than 3, the first of them 7 s after the fall. The whole
    # window would hold the count at 7 for another 24 s.
    assert first is not None
    assert first.replicas == 3
    assert first.reason == (
        "demand averaged at most 11.2 over 30s needs 3 replica(s) at 4 each "
        "(50% of the 60s window: 7 to 3)"
    )
    assert first.inputs is not None
    assert first.inputs.down_wait_s == 30.0
    assert first.inputs.down_wait_max == pytest.approx((3 * 28 + 7 * 4) / 10)
    assert first.inputs.down_window_max == pytest.approx(28.0)  # the whole minute's
    assert whole.seconds(1, 4.0) is None
    share.seconds(3, 4.0)
    assert share.replicas == 1  # 40 s after the fall, where the whole window takes 70


def test_a_drop_by_one_replica_still_waits_most_of_the_window() -> None:
    demand = Demand(model(1, SHARE))
    demand.seconds(70, 15.0)
    assert demand.replicas == 4

    # 11 needs 3: a drop from 4 to 3 waits 3/4 of the minute, not the half a deeper one may.
    assert demand.seconds(45, 11.0) is None
    assert demand.seconds(15, 11.0) is not None
    assert demand.replicas == 3


def test_a_signal_swinging_across_a_threshold_does_not_flap_with_a_shorter_wait() -> None:
    demand = Demand(model(1, SHARE))
    counts = []
    for _ in range(40):
        demand.seconds(3, 13.0)
        demand.seconds(3, 1.0)
        counts.append(demand.replicas)

    # The swings' ten-second averages need 3 (of 4) at their peaks: a drop by one waits
    # three quarters of the minute, and the count stays there.
    assert counts == [4] * 8 + [3] * 32


def test_a_down_window_share_outside_zero_to_one_is_refused() -> None:
    for share in (0.0, -0.5, 1.5):
        spec = ModelSpec(
            name="llama",
            command="sim --port {port}",
            autoscale=replace(POLICY, down_window_min_share=share),
        )
        [error] = validate_spec(spec)
        assert error.field == "autoscale.down_window_min_share"
    accepted = ModelSpec(name="llama", command="sim --port {port}", autoscale=SHARE)
    assert validate_spec(accepted) == []


@hypothesis.given(
    demands=st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=60),
    gaps=st.lists(st.floats(0.01, 5), min_size=60, max_size=60),
    stands_for=st.lists(st.none() | st.floats(0, 3), min_size=60, max_size=60),
    window_s=st.floats(0, 30),
    first_share=st.floats(0, 1),
)
def test_the_means_ending_at_each_sample_are_each_window_s_mean(
    demands: list[float],
    gaps: list[float],
    stands_for: list[float | None],
    window_s: float,
    first_share: float,
) -> None:
    """The means a pass computes in one walk over the samples are, to the bit, the mean over
    the window ending at each sample, gaps in the passes and all."""
    at, samples = T0, []
    for demand, gap, stands_for_s in zip(demands, gaps, stands_for, strict=False):
        at += timedelta(seconds=gap)
        samples.append(DemandSample(at, demand, stands_for_s=stands_for_s))
    timeline = autoscale._Timeline(samples)
    first = int(first_share * (len(samples) - 1))

    walked = timeline.means_ending_at_each(window_s, first)

    assert walked == [timeline.mean(s.at, window_s) for s in samples[first:]]


@hypothesis.given(
    demands=st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=60),
    gaps=st.lists(st.floats(0.01, 5), min_size=60, max_size=60),
    window_s=st.floats(0.5, 30),
    from_share=st.floats(0, 1),
    ask_share=st.floats(0, 1),
)
def test_the_highest_means_from_a_moment_on_are_those_of_every_mean(
    demands: list[float], gaps: list[float], window_s: float, from_share: float, ask_share: float
) -> None:
    """A pass computes the means only from the start of the down window on: what it
    answers for any moment from there is what the means ending at every sample give."""
    at, samples = T0, []
    for demand, gap in zip(demands, gaps, strict=False):
        at += timedelta(seconds=gap)
        samples.append(DemandSample(at, demand))
    timeline = autoscale._Timeline(samples)
    earliest = samples[0].at + (at - samples[0].at) * from_share
    moment = earliest + (at - earliest) * ask_share
    every = timeline.means_ending_at_each(window_s)
    later = [mean for s, mean in zip(samples, every, strict=True) if s.at >= moment]

    highest = autoscale._HighestAverages(timeline, window_s, earliest)

    assert highest.since(moment) == (max(later) if later else every[-1])
