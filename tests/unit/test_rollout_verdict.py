"""A canary step's verdict: a latency p95 judged only on enough samples on both sides, a
canary the gateways ejected for failing during its hold counted against it, and one failing
most of its requests rolled back without a baseline."""

from __future__ import annotations

import msgspec

from app.admin.rollouts import rollout_view
from app.domain import rollout_operations as rollouts
from app.domain.decision import Decision
from app.domain.events import (
    RolloutHoldEjectionSeen,
    RolloutHolding,
    RolloutPaused,
    RolloutRolledBack,
    RolloutVerdict,
    event_type,
)
from app.domain.model_spec import RolloutPolicy
from app.domain.rollout import INCONCLUSIVE, PROMOTE, ROLL_BACK, judge
from app.domain.rollout_reads import (
    canary_group,
    stable_group,
    verdict_groups,
    verdict_waits_for,
)
from app.domain.state import Model, ReplicaPhase
from app.domain.traffic import ReplicaTraffic, TrafficFigures, add_sample, merge
from app.services.operations import RolloutReport
from tests.unit.test_reconcile import Cluster, of_type
from tests.unit.test_rollouts import active_revisions, figures, holding_a_canary, of_type_in, run

POLICY = RolloutPolicy()


def measured(requests: int, ttft_ms: list[float], *, errors: int = 0) -> TrafficFigures:
    """One gateway's figures of ``requests``, of which the streamed ones took ``ttft_ms``
    to their first chunk (and as long to their last byte)."""
    histogram: dict[int, int] = {}
    for ms in ttft_ms:
        add_sample(histogram, ms)
    traffic = ReplicaTraffic(
        requests=requests, errors=errors, ttft=histogram, latency=dict(histogram)
    )
    figures = merge([(60.0, traffic)])
    assert figures is not None
    return figures


STABLE = measured(500, [100.0] * 400)


def test_one_slow_request_of_a_few_samples_does_not_fail_a_canary() -> None:
    # 30 requests, 3 of them streamed: their p95 is the slowest of the three.
    canary = measured(30, [100.0, 100.0, 900.0])

    verdict, reason = judge(canary, STABLE, POLICY)

    assert verdict == INCONCLUSIVE
    assert reason == (
        "TTFT p95 from 3 sample(s) of the new revision and 400 of the others; latency p95 "
        "from 3 sample(s) of the new revision and 400 of the others, fewer than "
        "min_latency_samples 50"
    )


def test_one_fast_request_of_a_few_samples_does_not_pass_a_canary() -> None:
    slow_stable = measured(500, [100.0] * 400)
    canary = measured(30, [90.0])

    assert judge(canary, slow_stable, POLICY)[0] == INCONCLUSIVE


def test_a_baseline_of_few_samples_is_waited_for_too() -> None:
    assert judge(measured(500, [100.0] * 400), measured(30, [500.0] * 3), POLICY)[0] == (
        INCONCLUSIVE
    )


def test_enough_samples_on_both_sides_are_judged() -> None:
    slow = measured(60, [100.0] * 47 + [900.0] * 3)
    two_slow = measured(60, [100.0] * 48 + [900.0] * 2)

    assert judge(slow, STABLE, POLICY)[0] == ROLL_BACK
    assert judge(two_slow, STABLE, POLICY)[0] == PROMOTE  # its p95 is the 48th of 50


def test_min_latency_samples_is_the_policy_s_to_lower_or_raise() -> None:
    canary = measured(30, [100.0, 100.0, 900.0])

    assert judge(canary, STABLE, RolloutPolicy(min_latency_samples=3))[0] == ROLL_BACK
    assert judge(STABLE, STABLE, RolloutPolicy(min_latency_samples=401))[0] == INCONCLUSIVE


def test_a_latency_neither_side_measured_is_not_waited_for() -> None:
    # No streamed answer on either side: no TTFT or latency to compare, nothing to wait for.
    assert judge(measured(30, []), measured(500, []), POLICY)[0] == PROMOTE


def test_errors_decide_without_waiting_for_latency_samples() -> None:
    verdict, reason = judge(measured(30, [100.0], errors=10), STABLE, POLICY)

    assert verdict == ROLL_BACK
    assert reason.startswith("error rate 33.3% against 0.0%")


def test_a_hold_that_ends_short_of_latency_samples_pauses_with_the_counts() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {
        canary_group("llama"): measured(30, [100.0, 100.0, 900.0]),
        stable_group("llama"): STABLE,
    }
    cluster.after(60)

    decision = cluster.reconcile()

    [verdict] = of_type(decision, RolloutVerdict)
    assert verdict.verdict == INCONCLUSIVE
    assert verdict.canary is not None
    assert verdict.stable is not None
    # The figures it judged carry the samples behind each p95, for the history.
    assert (verdict.canary.ttft_samples, verdict.stable.ttft_samples) == (3, 400)
    assert (verdict.canary.tpot_samples, verdict.canary.latency_samples) == (0, 3)
    [paused] = of_type(decision, RolloutPaused)
    assert paused.reason.startswith("no verdict: TTFT p95 from 3 sample(s) of the new revision")
    assert paused.reason.endswith("resume to promote, undo to roll back")
    assert of_type(decision, RolloutRolledBack) == []


def test_the_status_of_a_holding_step_says_what_its_verdict_waits_for() -> None:
    cluster = holding_a_canary()
    model = cluster.state.models["llama"]
    replicas = list(cluster.state.replicas.values())
    short = {
        canary_group("llama"): measured(30, [100.0, 100.0, 900.0]),
        stable_group("llama"): STABLE,
    }
    enough = {canary_group("llama"): STABLE, stable_group("llama"): STABLE}

    assert verdict_waits_for(model, replicas, short, {}) == (
        "TTFT p95 from 3 sample(s) of the new revision and 400 of the others; latency p95 "
        "from 3 sample(s) of the new revision and 400 of the others, fewer than "
        "min_latency_samples 50"
    )
    assert verdict_waits_for(model, replicas, {}, {}) == (
        "the gateways saw 0 request(s) to the new revision and 0 to the others, fewer than "
        "min_requests 20"
    )
    assert verdict_waits_for(model, replicas, enough, {}) is None
    assert set(verdict_groups(model, replicas)) == {canary_group("llama"), stable_group("llama")}
    paused = paused_model()
    assert verdict_waits_for(paused, replicas, short, {}) is None  # no step holds


def test_the_status_of_a_holding_step_counts_the_ejections_the_log_holds() -> None:
    # Given a canary step whose canary the gateways ejected earlier in the hold, and which
    # is back in rotation now, with too few samples of it to judge its latency ...
    cluster = holding_a_canary()
    canary = canary_id(cluster)
    cluster.ejected = {canary: 2}
    cluster.reconcile()
    cluster.ejected = {}
    short = {
        canary_group("llama"): measured(30, [100.0, 100.0, 900.0]),
        stable_group("llama"): STABLE,
    }

    # ... then the status shows it, and waits for nothing: the verdict counts that
    # ejection and decides.
    model = cluster.state.models["llama"]
    replicas = list(cluster.state.replicas.values())
    assert verdict_waits_for(model, replicas, short, {}) is None
    status = rollouts.rollout_status(cluster.state, "llama", cluster.now)
    view = rollout_view(RolloutReport(status=status, model=model, replicas=replicas), {})
    assert view.hold_ejections == {canary: 2}


def paused_model() -> Model:
    cluster = holding_a_canary()
    cluster.given(*rollouts.pause(cluster.state, "llama", "a look first").events)
    return cluster.state.models["llama"]


# -- ejections ---------------------------------------------------------------------------


def serving(cluster: Cluster, revision: int) -> list[str]:
    replicas = cluster.state.replicas.values()
    return sorted(
        r.id for r in replicas if r.revision == revision and r.phase is ReplicaPhase.SERVING
    )


def canary_id(cluster: Cluster) -> str:
    [replica] = serving(cluster, 2)
    return replica


def stable_ids(cluster: Cluster) -> list[str]:
    return serving(cluster, 1)


def good_figures(cluster: Cluster) -> None:
    cluster.traffic = {
        canary_group("llama"): figures(500),
        stable_group("llama"): figures(4500),
    }


def test_a_canary_the_gateways_eject_is_rolled_back_with_the_reason() -> None:
    # Its figures look fine: most of its requests succeeded before it began failing, and
    # since it was ejected the gateways send it one request a cool-off.
    cluster = holding_a_canary()
    good_figures(cluster)
    canary = canary_id(cluster)
    cluster.ejected = {canary: 2}
    cluster.after(60)

    events = run(cluster)

    [verdict] = of_type_in(events, RolloutVerdict)
    why = (
        f"the gateways ejected the new revision's replica(s) {canary} "
        "(by 2 gateway(s)) during the hold for failing requests in a row, and none of the others"
    )
    assert (verdict.verdict, verdict.reason) == (ROLL_BACK, why)
    [rolled_back] = of_type_in(events, RolloutRolledBack)
    assert rolled_back.reason == f"step 1: {why}"
    assert active_revisions(cluster) == [1, 1, 1, 1]


def test_a_canary_ejected_beside_the_old_revision_is_held_for_an_operator() -> None:
    cluster = holding_a_canary()
    good_figures(cluster)
    cluster.ejected = {canary_id(cluster): 1, stable_ids(cluster)[0]: 1}
    cluster.after(60)

    decision = cluster.reconcile()

    [verdict] = of_type(decision, RolloutVerdict)
    assert verdict.verdict == INCONCLUSIVE
    assert "the gateways ejected replicas of both revisions for failing" in verdict.reason
    [paused] = of_type(decision, RolloutPaused)
    assert paused.reason.startswith("no verdict: the gateways ejected replicas of both")


def test_only_the_old_revision_ejected_does_not_hold_a_canary_back() -> None:
    cluster = holding_a_canary()
    good_figures(cluster)
    cluster.ejected = {stable_ids(cluster)[0]: 3, "some-other-model-1": 1}
    cluster.after(60)

    [verdict] = of_type(cluster.reconcile(), RolloutVerdict)

    assert verdict.verdict == PROMOTE


def test_a_canary_ejected_before_its_hold_ends_is_not_judged_early() -> None:
    cluster = holding_a_canary()
    good_figures(cluster)
    cluster.ejected = {canary_id(cluster): 1}

    assert of_type(cluster.reconcile(), RolloutVerdict) == []


def test_a_canary_failing_most_requests_is_rolled_back_without_a_baseline() -> None:
    # The old revision got almost no traffic, and the gateways do not eject the canary
    # (--eject-after-failures 0): it fails most of what it is sent, in plain sight.
    policy = RolloutPolicy(min_requests=20)
    quiet = figures(3)

    verdict, reason = judge(figures(40, errors=40), quiet, policy)

    assert verdict == ROLL_BACK
    assert reason == (
        "40 of 40 request(s) to the new revision failed, more than 50% of min_requests 20 "
        "or more: rolled back whatever the others' error rate (3 request(s) to them, too "
        "few to compare with)"
    )
    assert judge(figures(40, errors=21), None, policy)[0] == ROLL_BACK
    # Short of min_requests, those it lacks count as successes: 11 of 20 is over half.
    assert judge(figures(11, errors=11), quiet, policy)[0] == ROLL_BACK
    assert judge(figures(10, errors=10), quiet, policy)[0] == INCONCLUSIVE
    # Half is not more than half, and an old revision failing as much excuses nothing.
    assert judge(figures(40, errors=20), quiet, policy)[0] == INCONCLUSIVE
    assert judge(figures(40, errors=40), figures(3, errors=2), policy)[0] == INCONCLUSIVE


def hold_ejections(cluster: Cluster) -> dict[str, int]:
    rollout = cluster.state.models["llama"].rollout
    assert rollout is not None
    return rollout.hold_ejections


def ejections_seen(decision: Decision) -> list[tuple[str, int]]:
    return [
        (p.event.replica_id, p.event.gateways)  # type: ignore[union-attr]
        for p in decision.events
        if event_type(p.event) == "rollout_hold_ejection_seen"
    ]


def test_the_log_keeps_each_hold_s_ejections_and_only_those() -> None:
    # Given a canary step that holds, and gateways ejecting its canary on one pass ...
    cluster = holding_a_canary()
    canary, stable = canary_id(cluster), stable_ids(cluster)[0]
    cluster.ejected = {canary: 2, "mistral-1": 1}
    assert ejections_seen(cluster.reconcile()) == [(canary, 2)]
    assert hold_ejections(cluster) == {canary: 2}  # no replica of a model that holds none

    # ... its canary is kept, with the most gateways seen ejecting it, on the passes after
    # it is back in rotation, beside what later passes see.
    cluster.ejected = {canary: 1}
    assert ejections_seen(cluster.reconcile()) == []
    cluster.ejected = {stable: 1}
    assert ejections_seen(cluster.reconcile()) == [(stable, 1)]
    assert hold_ejections(cluster) == {canary: 2, stable: 1}

    # An ejection of another step changes nothing; a hold started over begins with none ...
    rollout = cluster.state.models["llama"].rollout
    assert rollout is not None
    other_step = RolloutHoldEjectionSeen(
        model="llama", rollout_id=rollout.id, step=rollout.step + 1, replica_id=canary, gateways=5
    )
    cluster.given(other_step)
    assert hold_ejections(cluster) == {canary: 2, stable: 1}
    cluster.given(RolloutHolding(model="llama", rollout_id=rollout.id, step=0, hold_s=60.0))
    assert hold_ejections(cluster) == {}

    # ... and a rollout that holds no step records none.
    cluster.given(*rollouts.undo(cluster.state, "llama").events)
    cluster.ejected = {canary: 1}
    assert ejections_seen(cluster.reconcile()) == []


def abandoning(figures: TrafficFigures, abandoned: int) -> TrafficFigures:
    """``figures`` and ``abandoned`` requests whose clients left before any answer came."""
    return msgspec.structs.replace(
        figures, cancelled=figures.cancelled + abandoned, abandoned=abandoned
    )


def test_a_hung_canary_whose_clients_give_up_is_rolled_back() -> None:
    # The canary answers almost nothing: its clients leave before any answer comes, and the
    # old revision gets too little traffic to compare with.
    policy = RolloutPolicy(min_requests=20)

    verdict, reason = judge(abandoning(figures(2), 38), figures(3), policy)

    assert verdict == ROLL_BACK
    assert reason.startswith("38 of 40 request(s) to the new revision failed, more than 50%")
    # Against a baseline, what its clients gave up on counts as failed too ...
    assert judge(abandoning(figures(500), 100), STABLE, POLICY)[1].startswith(
        "error rate 16.7% against 0.0%"
    )
    # ... on both sides: clients as impatient with both revisions change nothing.
    same = judge(abandoning(figures(500), 5), abandoning(figures(4500), 45), POLICY)
    assert same[0] == PROMOTE
    # Cancels once the answer had begun (a client stopping a stream) are no failure.
    cancelled = msgspec.structs.replace(figures(2), cancelled=38)
    assert judge(cancelled, figures(3), policy)[0] == INCONCLUSIVE


def test_a_verdict_records_the_abandoned_requests_it_counted_as_failed() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {
        canary_group("llama"): abandoning(figures(500), 100),
        stable_group("llama"): figures(4500),
    }
    cluster.after(60)

    [verdict] = of_type(cluster.reconcile(), RolloutVerdict)

    assert verdict.verdict == ROLL_BACK
    assert verdict.canary is not None
    judged = verdict.canary
    assert (judged.requests, judged.errors, judged.abandoned) == (600, 100, 100)
