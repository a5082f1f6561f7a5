"""Stories of rollouts, on a fixed clock: a new revision replaces the running one step by
step through moves, never serving fewer replicas than desired; a canary is judged by the
gateways' figures; a failing revision is rolled back by itself; an operator pauses, resumes
and undoes."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from app.domain import model_operations as model_ops
from app.domain import node_operations as node_ops
from app.domain import rollout_operations as rollouts
from app.domain.commands import StartShard
from app.domain.events import (
    ModelDeclared,
    ModelScaled,
    ModelUnplaceable,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaStopping,
    RolloutFinished,
    RolloutHolding,
    RolloutPaused,
    RolloutRolledBack,
    RolloutStarted,
    RolloutStepStarted,
    RolloutVerdict,
    ShardFailed,
    ShardStarting,
)
from app.domain.keys import utc_text
from app.domain.model_spec import (
    AutoscalePolicy,
    CanaryStep,
    ModelSpec,
    RolloutPolicy,
    validate_spec,
)
from app.domain.move_views import moves_of
from app.domain.operation_results import InvalidOperation
from app.domain.rollout import INCONCLUSIVE, PROMOTE, ROLL_BACK, judge
from app.domain.rollout_reads import canary_group, stable_group, verdict_waits_for
from app.domain.state import ReplicaPhase, RolloutState
from app.domain.traffic import TrafficFigures
from tests.unit.test_reconcile import Cluster, of_type, with_two_nodes_and_a_model

UPGRADED = "sim --port {port} --model {model} --upgraded"


def serving(**policy: object) -> Cluster:
    """Four replicas of revision 1 serving, with ``policy`` as the model's rollout policy."""
    cluster = with_two_nodes_and_a_model(replicas=4, rollout=RolloutPolicy(**policy))  # type: ignore[arg-type]
    cluster.reconcile()
    for replica_id in sorted(cluster.state.replicas):
        cluster.serve(replica_id)
    return cluster


def revise(cluster: Cluster, command: str = UPGRADED) -> None:
    spec = replace(cluster.state.models["llama"].spec, command=command)
    cluster.given(*model_ops.apply_model(cluster.state, spec).events)


def serving_count(cluster: Cluster) -> int:
    """Replicas that serve, a move's original and its serving replacement counted once."""
    replicas = list(cluster.state.replicas.values())
    live = [r for r in replicas if r.phase in (ReplicaPhase.SERVING, ReplicaPhase.DRAINING)]
    replaced = {r.replaces for r in live if r.phase is ReplicaPhase.SERVING and r.replaces}
    return sum(1 for r in live if not (r.phase is ReplicaPhase.DRAINING and r.id in replaced))


def step(cluster: Cluster) -> list[object]:
    """One round: a pass, then the agents do what it asked (new replicas come up, stopping
    ones go), and eleven seconds pass (past the stability window)."""
    events = [p.event for p in cluster.reconcile().events]
    for replica in list(cluster.state.replicas.values()):
        if replica.phase is ReplicaPhase.PLACED:
            cluster.serve(replica.id)
        elif replica.phase is ReplicaPhase.STOPPING:
            cluster.stop_reported(replica.id)
    cluster.after(11)
    return events


def run(cluster: Cluster, rounds: int = 40) -> list[object]:
    """Rounds until the rollout is no longer under way; every event of them, in order.
    Checks on every round that as many replicas serve as the model desires."""
    seen: list[object] = []
    for _ in range(rounds):
        seen.extend(step(cluster))
        assert serving_count(cluster) >= cluster.state.models["llama"].desired
        rollout = cluster.state.models["llama"].rollout
        if rollout is not None and not rollout.under_way:
            seen.extend(p.event for p in cluster.reconcile().events)
            return seen
    raise AssertionError(f"the rollout did not finish in {rounds} rounds")


def active_revisions(cluster: Cluster) -> list[int]:
    return sorted(
        r.revision
        for r in cluster.state.replicas.values()
        if r.phase in (ReplicaPhase.SERVING, ReplicaPhase.PLACED, ReplicaPhase.STARTING)
    )


def figures(requests: int, *, errors: int = 0, ttft_ms: float = 100.0) -> TrafficFigures:
    return TrafficFigures(
        window_s=60.0,
        gateways=1,
        requests=requests,
        errors=errors,
        cancelled=0,
        error_rate=errors / requests if requests else None,
        ttft_p95_ms=ttft_ms,
        ttft_samples=requests,
        tpot_p95_ms=20.0,
        tpot_samples=requests,
        latency_p95_ms=ttft_ms * 5,
        latency_samples=requests,
    )


# -- rolling updates -------------------------------------------------------------------


def test_a_rolling_update_moves_one_replica_at_a_time_and_never_serves_fewer_than_desired() -> None:
    cluster = serving()
    originals = sorted(cluster.state.replicas)
    revise(cluster)

    events = run(cluster)

    moved = [e.replica_id for e in events if isinstance(e, ReplicaDrainStarted)]
    assert moved == originals
    placed = [e for e in events if isinstance(e, ReplicaPlaced)]
    assert [(p.replaces, p.revision) for p in placed] == [(o, 2) for o in originals]
    assert active_revisions(cluster) == [2, 2, 2, 2]
    finished = of_type_in(events, RolloutFinished)
    assert [(f.succeeded, f.outcome) for f in finished] == [(True, "every replica runs revision 2")]
    assert cluster.state.models["llama"].rollout.state is RolloutState.SUCCEEDED  # type: ignore[union-attr]


def of_type_in(events: list[object], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def test_max_surge_moves_that_many_replicas_at_once() -> None:
    cluster = serving(max_surge=2)
    revise(cluster)
    cluster.reconcile()  # the step starts

    first = cluster.reconcile()

    assert len(of_type(first, ReplicaDrainStarted)) == 2
    assert len(of_type(first, ReplicaPlaced)) == 2
    assert len(of_type(cluster.reconcile(), ReplicaDrainStarted)) == 0


def test_max_unavailable_stops_an_original_before_its_replacement_serves() -> None:
    cluster = serving(max_surge=0, max_unavailable=1)
    revise(cluster)
    cluster.reconcile()

    first = cluster.reconcile()

    stopping = of_type(first, ReplicaStopping)
    assert [s.replica_id for s in stopping] == ["llama-1"]
    assert "max_unavailable 1" in stopping[0].reason
    assert [p.revision for p in of_type(first, ReplicaPlaced)] == [2]
    assert of_type(first, ReplicaDrainStarted) == []
    assert of_type(cluster.reconcile(), ReplicaStopping) == []  # one at a time


def test_a_change_of_routing_or_replica_count_alone_starts_no_rollout() -> None:
    cluster = serving()
    spec = cluster.state.models["llama"].spec
    changed = replace(spec, replicas=5, routing=replace(spec.routing, weight=3.0))

    change = model_ops.apply_model(cluster.state, changed)

    assert [type(e).__name__ for e in change.events] == ["ModelDeclared"]
    cluster.given(*change.events)
    assert cluster.state.models["llama"].rollout is None


# -- canaries and verdicts ---------------------------------------------------------------

CANARY = (CanaryStep(replicas=1, traffic=0.1, hold_s=60.0),)


def holding_a_canary() -> Cluster:
    """One replica of revision 2 serving beside three of revision 1, the hold begun."""
    cluster = serving(steps=CANARY)
    revise(cluster)
    for _ in range(6):
        if of_type_in(step(cluster), RolloutHolding):
            break
    rollout = cluster.state.models["llama"].rollout
    assert rollout is not None
    assert rollout.holding_since is not None
    assert active_revisions(cluster) == [1, 1, 1, 2]
    return cluster


def test_a_canary_step_holds_with_its_share_of_traffic_and_is_promoted_by_good_figures() -> None:
    cluster = holding_a_canary()
    assert cluster.state.models["llama"].canary == (2, 0.1)
    cluster.traffic = {
        canary_group("llama"): figures(50, ttft_ms=110.0),
        stable_group("llama"): figures(450, ttft_ms=100.0),
    }
    assert of_type(cluster.reconcile(), RolloutVerdict) == []  # the hold is not over
    cluster.after(60)

    verdict = of_type_in(step(cluster), RolloutVerdict)

    assert [(v.verdict, v.step) for v in verdict] == [(PROMOTE, 0)]
    assert verdict[0].canary is not None
    assert verdict[0].canary.requests == 50
    run(cluster)
    assert active_revisions(cluster) == [2, 2, 2, 2]
    assert cluster.state.models["llama"].canary is None


def test_a_slower_canary_is_rolled_back_by_its_verdict_and_the_old_revision_serves_again() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {
        canary_group("llama"): figures(50, ttft_ms=400.0),
        stable_group("llama"): figures(450, ttft_ms=100.0),
    }
    cluster.after(60)

    events = run(cluster)

    [verdict] = of_type_in(events, RolloutVerdict)
    assert verdict.verdict == ROLL_BACK
    assert "TTFT p95 400.0 ms against 100.0 ms" in verdict.reason
    [rolled_back] = of_type_in(events, RolloutRolledBack)
    assert rolled_back.to_revision == 1
    assert rolled_back.spec.command == "sim --port {port} --model {model}"
    assert cluster.state.models["llama"].revision == 1
    assert active_revisions(cluster) == [1, 1, 1, 1]
    [finished] = of_type_in(events, RolloutFinished)
    assert not finished.succeeded
    assert finished.outcome.startswith("rolled back to revision 1")


def test_a_canary_with_more_errors_is_rolled_back() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {
        canary_group("llama"): figures(50, errors=5),
        stable_group("llama"): figures(450, errors=1),
    }
    cluster.after(60)

    [verdict] = of_type(cluster.reconcile(), RolloutVerdict)

    assert verdict.verdict == ROLL_BACK
    assert verdict.reason.startswith("error rate 10.0% against 0.2%")


def test_too_few_requests_pause_the_rollout_and_a_resume_promotes_the_step() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {
        canary_group("llama"): figures(3),
        stable_group("llama"): figures(450),
    }
    cluster.after(60)

    decision = cluster.reconcile()

    assert [v.verdict for v in of_type(decision, RolloutVerdict)] == [INCONCLUSIVE]
    [paused] = of_type(decision, RolloutPaused)
    assert "3 request(s) to the new revision" in paused.reason
    assert of_type(cluster.reconcile(), RolloutStepStarted) == []
    cluster.given(*rollouts.resume(cluster.state, "llama").events)
    assert [s.step for s in of_type(cluster.reconcile(), RolloutStepStarted)] == [1]
    run(cluster)
    assert active_revisions(cluster) == [2, 2, 2, 2]


def test_a_paused_canary_outlives_a_scale_down_to_the_steps_own_count() -> None:
    # Given a canary of one replica paused in its hold beside three of revision 1 ...
    cluster = holding_a_canary()
    cluster.given(*rollouts.pause(cluster.state, "llama", "a look at the dashboards").events)

    # ... when the model is scaled down to one replica, as many as the step runs ...
    cluster.given(*model_ops.scale(cluster.state, "llama", 1).events)
    for _ in range(4):
        step(cluster)

    # ... then the old revision's replicas went, and the canary under test is kept.
    assert active_revisions(cluster) == [2]


def test_a_hold_left_with_no_replica_of_another_revision_pauses_saying_so() -> None:
    # Given a canary holding beside three replicas of revision 1, when the model is
    # scaled down to the canary alone (old replicas go first) ...
    cluster = holding_a_canary()
    cluster.given(*model_ops.scale(cluster.state, "llama", 1).events)
    for _ in range(4):
        step(cluster)
    assert active_revisions(cluster) == [2]
    cluster.traffic = {canary_group("llama"): figures(30)}
    model = cluster.state.models["llama"]
    alone = (
        "revision 2 runs on every replica of the model (1): none of another revision is left "
        "to judge the step against"
    )
    replicas = list(cluster.state.replicas.values())

    assert verdict_waits_for(model, replicas, cluster.traffic, {}) == alone
    cluster.after(60)
    decision = cluster.reconcile()

    # ... then the verdict, and the pause, say there is nothing to compare with.
    [verdict] = of_type(decision, RolloutVerdict)
    assert (verdict.verdict, verdict.reason) == (INCONCLUSIVE, alone)
    [paused] = of_type(decision, RolloutPaused)
    assert paused.reason == f"no verdict: {alone}; resume to promote, undo to roll back"


def test_a_canary_failing_alone_on_the_model_is_rolled_back_all_the_same() -> None:
    cluster = holding_a_canary()
    cluster.given(*model_ops.scale(cluster.state, "llama", 1).events)
    for _ in range(4):
        step(cluster)
    cluster.traffic = {canary_group("llama"): figures(30, errors=30)}
    cluster.after(60)

    [verdict] = of_type(cluster.reconcile(), RolloutVerdict)

    assert verdict.verdict == ROLL_BACK


def test_a_canary_paused_by_an_operator_past_its_hold_is_judged_when_resumed() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {
        canary_group("llama"): figures(50, errors=25, ttft_ms=900.0),
        stable_group("llama"): figures(450, ttft_ms=100.0),
    }
    cluster.after(10)
    cluster.given(*rollouts.pause(cluster.state, "llama", "looking at the dashboards").events)
    cluster.after(120)  # the hold runs out during the pause
    assert of_type(cluster.reconcile(), RolloutVerdict) == []  # no verdict while paused
    cluster.given(*rollouts.resume(cluster.state, "llama").events)

    decision = cluster.reconcile()

    [verdict] = of_type(decision, RolloutVerdict)
    assert verdict.verdict == ROLL_BACK
    assert verdict.reason.startswith("error rate 50.0% against 0.0%")
    assert of_type(decision, RolloutStepStarted) == []
    assert len(of_type(decision, RolloutRolledBack)) == 1
    run(cluster)
    assert active_revisions(cluster) == [1, 1, 1, 1]


def test_an_operator_pause_after_an_inconclusive_verdict_leaves_resume_to_promote() -> None:
    cluster = holding_a_canary()
    cluster.traffic = {canary_group("llama"): figures(3), stable_group("llama"): figures(450)}
    cluster.after(60)
    assert [v.verdict for v in of_type(cluster.reconcile(), RolloutVerdict)] == [INCONCLUSIVE]
    cluster.given(*rollouts.resume(cluster.state, "llama").events)
    cluster.given(*rollouts.pause(cluster.state, "llama", "one more look").events)
    cluster.given(*rollouts.resume(cluster.state, "llama").events)

    decision = cluster.reconcile()

    assert of_type(decision, RolloutVerdict) == []
    assert [s.step for s in of_type(decision, RolloutStepStarted)] == [1]


# -- scaling during a rollout ------------------------------------------------------------


def started_revisions(decision: object) -> dict[str, bool]:
    """For each replica a pass starts: whether its engine runs the new revision's command."""
    return {
        c.command.replica_id: "--upgraded" in c.command.argv
        for c in decision.commands  # type: ignore[attr-defined]
        if isinstance(c.command, StartShard)
    }


def test_replicas_added_during_a_canary_step_run_the_revision_it_comes_from() -> None:
    cluster = holding_a_canary()
    cluster.given(*model_ops.scale(cluster.state, "llama", 6).events)

    decision = cluster.reconcile()

    placed = of_type(decision, ReplicaPlaced)
    assert [p.revision for p in placed] == [1, 1]
    assert "at revision 1: the rollout's step runs revision 2 on no more replicas" in (
        placed[0].reason
    )
    assert started_revisions(decision) == {p.replica_id: False for p in placed}
    for replica in placed:
        cluster.serve(replica.replica_id)
    assert active_revisions(cluster) == [1, 1, 1, 1, 1, 2]
    cluster.traffic = {canary_group("llama"): figures(50), stable_group("llama"): figures(450)}
    cluster.after(60)
    run(cluster)
    assert active_revisions(cluster) == [2] * 6


def test_a_model_scaled_down_during_a_canary_step_keeps_its_canary() -> None:
    cluster = holding_a_canary()
    cluster.given(*model_ops.scale(cluster.state, "llama", 2).events)

    decision = cluster.reconcile()

    stopped = {s.replica_id for s in of_type(decision, ReplicaStopping)}
    assert {cluster.state.replicas[r].revision for r in stopped} == {1}
    assert len(stopped) == 2
    assert of_type(decision, ReplicaDrainStarted) == []


def test_a_model_scaled_up_from_zero_while_its_rollout_is_paused_meets_the_canary_first() -> None:
    cluster = serving(steps=CANARY)
    revise(cluster)
    cluster.given(*rollouts.pause(cluster.state, "llama", "not now").events)
    cluster.given(*model_ops.scale(cluster.state, "llama", 0).events)
    for _ in range(3):
        step(cluster)
    assert active_revisions(cluster) == []
    # Declared again with a count, the same revision: the spec of revision 1 stays known
    # though none of its replicas runs.
    spec = replace(cluster.state.models["llama"].spec, replicas=3)
    cluster.given(*model_ops.apply_model(cluster.state, spec).events)

    decision = cluster.reconcile()

    assert sorted(p.revision for p in of_type(decision, ReplicaPlaced)) == [1, 1, 2]
    assert sorted(started_revisions(decision).values()) == [False, False, True]


def test_a_drain_during_a_canary_step_replaces_an_old_replica_with_an_old_one() -> None:
    cluster = holding_a_canary()
    [old] = [r.id for r in cluster.state.replicas.values() if r.revision == 1 and r.number == 2]
    cluster.given(*node_ops.drain_replica(cluster.state, old, "drain-1").events)

    placed = of_type(cluster.reconcile(), ReplicaPlaced)

    assert [(p.replaces, p.revision) for p in placed] == [(old, 1)]


# -- failures ------------------------------------------------------------------------------


def test_a_revision_whose_replicas_fail_to_start_is_rolled_back_and_the_old_ones_never_moved() -> (
    None
):
    cluster = serving(max_failures=2)
    originals = {r.id: r for r in cluster.state.replicas.values()}
    revise(cluster, "sim --port {port} --model {model} --exit-at-start")
    cluster.reconcile()
    events: list[object] = []
    for _ in range(2):
        cluster.reconcile()
        [new] = [
            r
            for r in cluster.state.replicas.values()
            if r.revision == 2 and r.phase is ReplicaPhase.PLACED
        ]
        shard = new.shards[0]
        cluster.given(
            ShardStarting(replica_id=new.id, shard_index=0, node_id=shard.node_id),
            ShardFailed(replica_id=new.id, shard_index=0, node_id=shard.node_id, error="exit 1"),
        )
        events.extend(p.event for p in cluster.reconcile().events)
        cluster.after(30)  # past the model's backoff

    events.extend(run(cluster))

    [rolled_back] = of_type_in(events, RolloutRolledBack)
    assert rolled_back.reason.startswith("2 replica(s) of revision 2 failed to start")
    assert cluster.state.models["llama"].revision == 1
    # The original that was moving serves on; none was stopped.
    for replica_id in originals:
        assert cluster.state.replicas[replica_id].phase is ReplicaPhase.SERVING
    assert active_revisions(cluster) == [1, 1, 1, 1]


def first_new_replica_failed() -> Cluster:
    """A rollout allowed one failure, whose first replica of revision 2 just failed."""
    cluster = serving(max_failures=1)
    revise(cluster, "sim --port {port} --model {model} --exit-at-start")
    cluster.reconcile()  # the step starts
    cluster.reconcile()  # the first move: a replica of revision 2 is placed
    [new] = [r for r in cluster.state.replicas.values() if r.revision == 2]
    shard = new.shards[0]
    cluster.given(
        ShardStarting(replica_id=new.id, shard_index=0, node_id=shard.node_id),
        ShardFailed(replica_id=new.id, shard_index=0, node_id=shard.node_id, error="exit 1"),
    )
    return cluster


def test_a_rollback_that_is_home_in_the_pass_that_decided_it_finishes_with_its_reason() -> None:
    cluster = first_new_replica_failed()

    decision = cluster.reconcile()

    [rolled_back] = of_type(decision, RolloutRolledBack)
    # Nothing of revision 2 is left to replace: the rollback is home at once.
    [finished] = of_type(decision, RolloutFinished)
    assert not finished.succeeded
    assert finished.outcome == f"rolled back to revision 1: {rolled_back.reason}"
    assert rolled_back.reason.startswith("1 replica(s) of revision 2 failed to start")


def test_a_rolled_back_rollout_refuses_a_pause_saying_why_once() -> None:
    cluster = first_new_replica_failed()
    [finished] = of_type(cluster.reconcile(), RolloutFinished)

    with pytest.raises(InvalidOperation) as refused:
        rollouts.pause(cluster.state, "llama", "")

    assert str(refused.value) == (
        f"rollout {finished.rollout_id} cannot be paused: it was {finished.outcome}"
    )


def test_failures_while_paused_count_and_roll_the_rollout_back_at_max_failures() -> None:
    cluster = serving(max_failures=2, max_surge=2)
    revise(cluster, "sim --port {port} --model {model} --exit-at-start")
    cluster.reconcile()  # the step starts
    cluster.reconcile()  # two moves: two replicas of revision 2 are placed
    cluster.given(*rollouts.pause(cluster.state, "llama", "looking at the dashboards").events)
    events: list[object] = []
    for _ in range(4):
        for new in [
            r
            for r in cluster.state.replicas.values()
            if r.revision == 2 and r.phase is ReplicaPhase.PLACED
        ]:
            node_id = new.shards[0].node_id
            cluster.given(
                ShardStarting(replica_id=new.id, shard_index=0, node_id=node_id),
                ShardFailed(replica_id=new.id, shard_index=0, node_id=node_id, error="exit 1"),
            )
        events.extend(step(cluster))
        cluster.after(30)  # past the model's backoff

    [rolled_back] = of_type_in(events, RolloutRolledBack)
    assert rolled_back.reason.startswith("2 replica(s) of revision 2 failed to start")
    after = events[events.index(rolled_back) :]
    assert [p for p in of_type_in(after, ReplicaPlaced) if p.revision == 2] == []
    [finished] = of_type_in(events, RolloutFinished)
    assert not finished.succeeded
    rollout = cluster.state.models["llama"].rollout
    assert rollout is not None
    assert (rollout.state, rollout.failures) == (RolloutState.ROLLED_BACK, 2)
    assert cluster.state.models["llama"].revision == 1
    assert active_revisions(cluster) == [1, 1, 1, 1]


# -- an operator's hand --------------------------------------------------------------------


def test_a_paused_rollout_starts_no_move_until_it_is_resumed() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    step(cluster)
    cluster.given(*rollouts.pause(cluster.state, "llama", "looking at the dashboards").events)
    for _ in range(4):
        step(cluster)
    status = rollouts.rollout_status(cluster.state, "llama", cluster.now)
    assert status.rollout.state is RolloutState.PAUSED
    assert status.moves == ()
    stuck = active_revisions(cluster)
    assert 1 in stuck

    cluster.given(*rollouts.resume(cluster.state, "llama").events)
    run(cluster)

    assert active_revisions(cluster) == [2, 2, 2, 2]


def test_undo_in_the_middle_rolls_back_and_undo_after_success_declares_the_old_spec_again() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    step(cluster)
    cluster.given(*rollouts.undo(cluster.state, "llama").events)
    run(cluster)
    assert cluster.state.models["llama"].revision == 1
    assert active_revisions(cluster) == [1, 1, 1, 1]

    revise(cluster)  # the same change again is the next number: 3
    run(cluster)
    assert cluster.state.models["llama"].revision == 3
    change = rollouts.undo(cluster.state, "llama")
    declared = change.events[0]
    assert isinstance(declared, ModelDeclared)
    assert (declared.revision, declared.spec.command) == (4, "sim --port {port} --model {model}")
    cluster.given(*change.events)
    run(cluster)
    assert active_revisions(cluster) == [4, 4, 4, 4]


def test_a_repeated_undo_after_success_is_refused_instead_of_undoing_the_undo() -> None:
    cluster = serving()
    revise(cluster)
    run(cluster)
    assert cluster.state.models["llama"].rollout.state is RolloutState.SUCCEEDED  # type: ignore[union-attr]
    cluster.given(*rollouts.undo(cluster.state, "llama", "rollout-llama-r2").events)
    assert cluster.state.models["llama"].revision == 3  # revision 1's spec, declared again

    with pytest.raises(InvalidOperation) as refused:
        rollouts.undo(cluster.state, "llama", "rollout-llama-r2")

    assert str(refused.value).startswith(
        "rollout rollout-llama-r2 cannot be undone: it is not the model's rollout any more "
        "(undone or superseded already); the model's rollout is rollout-llama-r3, revision "
        "2 -> 3, running, started at "
    )
    assert cluster.state.models["llama"].revision == 3
    # Naming the undo's own rollout undoes it.
    cluster.given(*rollouts.undo(cluster.state, "llama", "rollout-llama-r3").events)
    assert cluster.state.models["llama"].revision == 2


def test_an_unnamed_undo_repeated_after_success_is_refused_instead_of_undoing_the_undo() -> None:
    cluster = serving()
    revise(cluster)
    run(cluster)
    first = rollouts.undo(cluster.state, "llama")
    started = first.events[1]
    assert isinstance(started, RolloutStarted)
    assert (started.rollout_id, started.undoes) == ("rollout-llama-r3", "rollout-llama-r2")
    cluster.given(*first.events)

    for moment in ("while the undo rolls out", "once it has rolled out"):
        with pytest.raises(InvalidOperation) as refused:
            rollouts.undo(cluster.state, "llama")
        assert str(refused.value).startswith(
            "rollout rollout-llama-r2 was undone already: the model's rollout is "
            "rollout-llama-r3, revision 2 -> 3, "
        ), moment
        assert str(refused.value).endswith(
            ", the undo of rollout-llama-r2, and an undo that does not name its rollout does "
            "not undo an undo; nothing was recorded. To undo rollout-llama-r3 itself, name it "
            "(rollout_id rollout-llama-r3: llmgw-cli rollout undo llama --rollout "
            "rollout-llama-r3); to go on to another spec, declare it (llmgw-cli models apply)"
        ), moment
        assert cluster.state.models["llama"].revision == 3, moment
        run(cluster)

    named = rollouts.undo(cluster.state, "llama", "rollout-llama-r3")
    again = named.events[1]
    assert isinstance(again, RolloutStarted)
    assert (again.revision, again.undoes) == (4, "rollout-llama-r3")
    cluster.given(*named.events)
    run(cluster)
    assert cluster.state.models["llama"].spec.command == UPGRADED
    # A rollout a declaration starts is undone without naming it, as before.
    revise(cluster, "sim --port {port} --model {model} --third")
    cluster.given(*rollouts.undo(cluster.state, "llama").events)
    assert cluster.state.models["llama"].spec.command == UPGRADED


def test_an_undo_naming_the_rollout_under_way_rolls_it_back_once() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    cluster.given(*rollouts.undo(cluster.state, "llama", "rollout-llama-r2").events)

    with pytest.raises(InvalidOperation, match="is already rolling back to revision 1"):
        rollouts.undo(cluster.state, "llama", "rollout-llama-r2")
    assert cluster.state.models["llama"].revision == 1


def test_a_paused_rollout_rolled_back_no_longer_says_why_it_paused() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    cluster.given(*rollouts.pause(cluster.state, "llama", "looking at the dashboards").events)
    cluster.given(*rollouts.undo(cluster.state, "llama").events)

    rollout = cluster.state.models["llama"].rollout
    assert rollout is not None
    assert (rollout.state, rollout.pause_reason) == (RolloutState.ROLLING_BACK, None)
    run(cluster)
    assert cluster.state.models["llama"].rollout.pause_reason is None  # type: ignore[union-attr]


def test_a_rollout_and_a_node_drain_at_the_same_time_both_finish() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    cluster.given(*node_ops.drain_node(cluster.state, "gpu-1", "drain-1", 3600).events)

    run(cluster, rounds=60)

    assert active_revisions(cluster) == [2, 2, 2, 2]
    for _ in range(10):
        step(cluster)
        if cluster.state.nodes["gpu-1"].drain_id is None:
            break
    assert cluster.state.nodes["gpu-1"].drain_id is None
    on_gpu_1 = [
        r
        for r in cluster.state.replicas.values()
        if r.phase is ReplicaPhase.SERVING and "gpu-1" in r.node_ids
    ]
    assert on_gpu_1 == []


# -- the moves -----------------------------------------------------------------------------


def test_a_drain_and_a_rollout_are_both_moves_read_from_the_model_by_their_id() -> None:
    cluster = serving()
    cluster.given(*node_ops.drain_replica(cluster.state, "llama-1", "drain-1").events)
    revise(cluster)
    cluster.reconcile()  # the rollout's first step starts
    cluster.reconcile()  # its first move, and a replacement for each move

    model = cluster.state.models["llama"]
    assert {(m.replica_id, m.move_id) for m in model.moves.values()} == {
        ("llama-1", "drain-1"),
        ("llama-2", "rollout-llama-r2"),
    }
    [drained] = moves_of(cluster.state, "drain-1")
    [rolled] = moves_of(cluster.state, "rollout-llama-r2")
    assert (drained.replacement_id, drained.replacement_phase) == ("llama-5", "placed")
    assert (rolled.replacement_id, rolled.replacement_phase) == ("llama-6", "placed")
    assert rollouts.rollout_status(cluster.state, "llama", cluster.now).moves == (rolled,)

    run(cluster)

    assert cluster.state.models["llama"].moves == {}
    assert moves_of(cluster.state, "drain-1") == ()


def test_a_replacement_loading_past_a_drain_s_grace_serves_before_its_original_stops() -> None:
    cluster = with_two_nodes_and_a_model(
        replicas=2, startup_timeout_s=1800.0, rollout=RolloutPolicy()
    )
    cluster.reconcile()
    for replica_id in sorted(cluster.state.replicas):
        cluster.serve(replica_id)
    revise(cluster)
    cluster.reconcile()  # the step starts
    cluster.reconcile()  # the first move: llama-1 draining, llama-3 placed at revision 2
    shard = cluster.state.replicas["llama-3"].shards[0]
    cluster.given(ShardStarting(replica_id="llama-3", shard_index=0, node_id=shard.node_id, pid=7))
    cluster.running(shard.node_id, "llama-3", shard.port, state="starting", pid=7)

    for _ in range(40):  # twenty minutes of loading, past a drained replica's 600 s grace
        cluster.after(30)
        assert of_type(cluster.reconcile(), ReplicaStopping) == []
        assert cluster.phase("llama-1") is ReplicaPhase.DRAINING

    cluster.serve("llama-3")
    run(cluster)
    assert active_revisions(cluster) == [2, 2]


def test_a_move_with_no_room_waits_saying_why_until_a_node_drain_s_grace_stops_it() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=1)
    cluster.node("gpu-2", n_gpus=1)
    cluster.model(replicas=2, rollout=RolloutPolicy())
    cluster.after(31)
    cluster.reconcile()
    for replica_id in sorted(cluster.state.replicas):
        cluster.serve(replica_id)
    revise(cluster)
    cluster.reconcile()  # the step starts
    [unplaceable] = of_type(cluster.reconcile(), ModelUnplaceable)  # the first move
    assert "not enough healthy free GPUs" in unplaceable.reason
    cluster.after(700)
    assert of_type(cluster.reconcile(), ReplicaStopping) == []
    [moved] = [r for r in cluster.state.replicas.values() if r.phase is ReplicaPhase.DRAINING]

    cluster.given(*node_ops.drain_node(cluster.state, moved.node_ids[0], "drain-1", 300).events)
    cluster.after(299)
    assert of_type(cluster.reconcile(), ReplicaStopping) == []
    cluster.after(2)
    stopping = of_type(cluster.reconcile(), ReplicaStopping)

    assert [(s.replica_id, s.reason) for s in stopping] == [
        (moved.id, "drain drain-1: grace ran out before it could move")
    ]


def test_a_model_scaled_to_zero_in_the_middle_of_a_move_stops_the_moved_replica_too() -> None:
    cluster = serving()
    revise(cluster)
    cluster.reconcile()  # the step starts
    cluster.reconcile()  # the first move: llama-1 draining, llama-5 placed at revision 2
    cluster.given(ModelScaled(model="llama", replicas=0, previous=4))  # idle, by the autoscaler

    for _ in range(3):
        step(cluster)

    assert {r.id: r.phase for r in cluster.state.replicas.values()} == {
        f"llama-{n}": ReplicaPhase.STOPPED for n in range(1, 6)
    }
    assert cluster.state.models["llama"].moves == {}


def test_a_newer_revision_supersedes_a_rollout_under_way_and_every_replica_ends_at_it() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    step(cluster)

    revise(cluster, "sim --port {port} --model {model} --newest")
    run(cluster)

    model = cluster.state.models["llama"]
    assert model.rollout is not None
    assert (model.rollout.id, model.rollout.state) == ("rollout-llama-r3", RolloutState.SUCCEEDED)
    assert active_revisions(cluster) == [3, 3, 3, 3]


def test_a_model_removed_during_its_rollout_ends_the_rollout() -> None:
    cluster = serving()
    revise(cluster)
    step(cluster)
    cluster.given(*model_ops.remove(cluster.state, "llama").events)

    [finished] = of_type(cluster.reconcile(), RolloutFinished)

    assert (finished.succeeded, finished.outcome) == (False, "the model was removed")
    assert cluster.state.models["llama"].rollout.state is RolloutState.ENDED  # type: ignore[union-attr]


def test_a_model_removed_and_declared_again_before_a_pass_does_not_carry_on_its_rollout() -> None:
    cluster = holding_a_canary()
    first = cluster.state.models["llama"].rollout.from_spec  # type: ignore[union-attr]
    cluster.given(*model_ops.remove(cluster.state, "llama").events)

    again = model_ops.apply_model(cluster.state, first)  # revision 1's spec, before any pass

    finished, declared = again.events
    assert isinstance(finished, RolloutFinished)
    assert (finished.rollout_id, finished.succeeded) == ("rollout-llama-r2", False)
    assert finished.outcome == "the model was removed"
    assert isinstance(declared, ModelDeclared)
    cluster.given(*again.events)
    model = cluster.state.models["llama"]
    assert model.revision == 3
    assert model.rollout.state is RolloutState.ENDED  # type: ignore[union-attr]
    assert model.canary is None
    cluster.traffic = {canary_group("llama"): figures(3), stable_group("llama"): figures(450)}
    cluster.after(60)
    events = [p.event for _ in range(3) for p in cluster.reconcile().events]
    assert of_type_in(events, RolloutHolding) == []
    assert of_type_in(events, RolloutVerdict) == []
    assert of_type_in(events, RolloutPaused) == []
    assert of_type_in(events, RolloutFinished) == []


# -- the policy ------------------------------------------------------------------------------


def policy_errors(replicas: int = 4, **policy: object) -> list[tuple[str, str]]:
    spec = ModelSpec(
        name="llama",
        command="sim --port {port}",
        replicas=replicas,
        rollout=RolloutPolicy(**policy),  # type: ignore[arg-type]
    )
    return [(e.field, e.reason) for e in validate_spec(spec) if e.field.startswith("rollout.")]


def test_a_sound_policy_has_no_errors_and_the_last_step_is_every_replica() -> None:
    policy = RolloutPolicy(steps=CANARY)

    assert policy_errors(steps=CANARY, max_surge=2) == []
    assert [s.replicas for s in policy.all_steps] == [1, "all"]


def test_a_policy_that_cannot_work_is_refused_field_by_field() -> None:
    assert policy_errors(max_surge=0, max_unavailable=0) == [
        (
            "rollout.max_surge",
            "cannot be 0 while max_unavailable is 0 too: nothing could ever be replaced",
        )
    ]
    bad_steps = (
        CanaryStep(replicas=2, traffic=2.0),
        CanaryStep(replicas=1, hold_s=-1),
        CanaryStep(replicas="all", traffic=0.5),
        CanaryStep(replicas=3),
    )
    assert [field for field, _ in policy_errors(steps=bad_steps)] == [
        "rollout.steps[0].traffic",
        "rollout.steps[1].replicas",
        "rollout.steps[1].hold_s",
        "rollout.steps[2].replicas",
        "rollout.steps[2].traffic",
    ]
    assert [f for f, _ in policy_errors(max_latency_ratio=float("nan"), min_requests=0)] == [
        "rollout.max_latency_ratio",
        "rollout.min_requests",
    ]


def test_a_first_step_of_no_replica_is_told_its_bounds_and_not_of_a_step_before_it() -> None:
    for replicas in (0, -1):
        assert policy_errors(steps=(CanaryStep(replicas=replicas),)) == [
            ("rollout.steps[0].replicas", 'must be between 1 and 10000, or "all"')
        ]


def test_a_held_step_that_leaves_the_other_revision_nothing_to_judge_against_is_refused() -> None:
    whole_traffic = (
        CanaryStep(replicas=1, traffic=0.1, hold_s=60),
        CanaryStep(replicas=2, traffic=1, hold_s=60),
    )
    every_replica = (CanaryStep(replicas=1, hold_s=60), CanaryStep(replicas=4, hold_s=60))

    assert policy_errors(steps=whole_traffic) == [
        (
            "rollout.steps[1].traffic",
            "cannot be 1 on a step with a hold: the other revision would see no request to "
            "judge the step against",
        )
    ]
    assert policy_errors(steps=every_replica) == [
        (
            "rollout.steps[1].replicas",
            "must be fewer than the model's 4 replica(s) on a step with a hold: no replica of "
            "the other revision would be left to judge the step against",
        )
    ]
    assert [f for f, _ in policy_errors(replicas=1, steps=CANARY)] == ["rollout.steps[0].replicas"]
    # Without a hold there is no verdict to reach: all of the traffic, or every replica, may go.
    assert policy_errors(steps=(CanaryStep(replicas=1, traffic=1), CanaryStep(replicas=4))) == []
    assert policy_errors(replicas=0, steps=CANARY) == []  # nothing runs, nothing to roll out


def test_a_hold_on_the_step_of_every_replica_is_refused_as_one_never_kept() -> None:
    # The last step finishes the rollout the moment every replica runs the new revision:
    # a hold there would be shown and never kept, and would judge nothing if it were.
    held_all = (CanaryStep(replicas=1, hold_s=60), CanaryStep(replicas="all", hold_s=600))

    assert policy_errors(steps=held_all) == [
        (
            "rollout.steps[1].hold_s",
            'cannot be set on a step of "all" replicas: the rollout finishes once every '
            "replica runs the new revision, with no replica of another left to judge a hold "
            "against",
        )
    ]
    assert policy_errors(replicas=0, steps=held_all) != []  # wrong whatever the count
    unheld_all = (CanaryStep(replicas=1, hold_s=60), CanaryStep(replicas="all"))
    assert policy_errors(steps=unheld_all) == []


def test_an_autoscaled_model_s_held_step_is_refused_only_at_its_most_replicas() -> None:
    def errors(step: CanaryStep, replicas: int) -> list[str]:
        spec = ModelSpec(
            name="llama",
            command="sim --port {port}",
            replicas=replicas,  # the autoscaler's count of the moment
            autoscale=AutoscalePolicy(min_replicas=1, max_replicas=8),
            rollout=RolloutPolicy(steps=(step,)),
        )
        return [e.reason for e in validate_spec(spec) if e.field == "rollout.steps[0].replicas"]

    assert errors(CanaryStep(replicas=2, hold_s=60), replicas=2) == []
    assert errors(CanaryStep(replicas=8, hold_s=60), replicas=2) == [
        "must be fewer than autoscale max (8) on a step with a hold: no replica of the other "
        "revision would be left to judge the step against"
    ]


def test_a_verdict_compares_each_figure_with_its_threshold() -> None:
    policy = RolloutPolicy()
    stable = figures(100, errors=1, ttft_ms=100.0)

    assert judge(figures(100, errors=2, ttft_ms=119.0), stable, policy)[0] == PROMOTE
    assert judge(figures(100, errors=3, ttft_ms=100.0), stable, policy)[0] == ROLL_BACK
    assert judge(figures(100, ttft_ms=125.0), stable, policy)[0] == ROLL_BACK
    assert judge(figures(19), stable, policy)[0] == INCONCLUSIVE
    assert judge(None, stable, policy)[0] == INCONCLUSIVE


def test_a_canary_exactly_at_the_allowed_error_rate_increase_is_promoted() -> None:
    # "More than max_error_rate_increase above": exactly that much more is allowed, however
    # the two rates and the allowance fall in binary floating point (0.07 - 0.06 is not 0.01).
    one_point = RolloutPolicy(max_error_rate_increase=0.01)
    ten_points = RolloutPolicy(max_error_rate_increase=0.1, min_requests=10, min_latency_samples=10)

    assert judge(figures(100, errors=7), figures(100, errors=6), one_point)[0] == PROMOTE
    assert judge(figures(100, errors=10), figures(100, errors=9), one_point)[0] == PROMOTE
    assert judge(figures(1000, errors=29), figures(1000, errors=19), one_point)[0] == PROMOTE
    assert judge(figures(10, errors=8), figures(10, errors=7), ten_points)[0] == PROMOTE
    assert judge(figures(200, errors=14), figures(100, errors=6), one_point)[0] == PROMOTE
    assert judge(figures(100, errors=8), figures(100, errors=6), one_point)[0] == ROLL_BACK
    assert judge(figures(1001, errors=30), figures(1000, errors=19), one_point)[0] == ROLL_BACK


def test_a_canary_that_fails_during_its_hold_is_held_again_once_its_replacement_serves() -> None:
    cluster = holding_a_canary()
    [canary] = [r for r in cluster.state.replicas.values() if r.revision == 2]
    cluster.traffic = {
        canary_group("llama"): figures(50),
        stable_group("llama"): figures(450),
    }
    cluster.after(50)  # ten seconds of the hold left
    node_id = canary.shards[0].node_id
    cluster.given(ShardFailed(replica_id=canary.id, shard_index=0, node_id=node_id, error="exit"))
    report = cluster.reports[node_id]
    cluster.reports[node_id] = replace(
        report, shards={k: v for k, v in report.shards.items() if k[0] != canary.id}
    )

    events: list[object] = []
    for _ in range(6):
        events.extend(step(cluster))
        cluster.after(20)  # past the model's backoff
        if any(isinstance(e, RolloutHolding) for e in events):
            break

    # Its replacement serves long after the first hold ran out, and is held anew, a whole
    # hold, before any verdict: not judged at once on the figures of a replica just up,
    # beside the errors of the one that failed, which no group reads any more.
    assert of_type_in(events, RolloutVerdict) == []
    [held_again] = of_type_in(events, RolloutHolding)
    assert held_again.step == 0
    replacement = [
        r
        for r in cluster.state.replicas.values()
        if r.revision == 2 and r.phase is ReplicaPhase.SERVING
    ]
    assert len(replacement) == 1
    assert of_type(cluster.reconcile(), RolloutVerdict) == []
    cluster.after(60)
    verdict = of_type_in(step(cluster), RolloutVerdict)
    assert [v.verdict for v in verdict] == [PROMOTE]


def test_a_canary_whose_few_requests_failed_past_any_verdict_is_rolled_back() -> None:
    # A canary that fails every request is ejected by the gateways and gets one request a
    # cool-off: never min_requests in a window. Its errors already decide the verdict, since
    # no success among the requests it lacks could bring it within the allowance.
    policy = RolloutPolicy(min_requests=20, max_error_rate_increase=0.01)
    stable = figures(400, errors=4)

    verdict, reason = judge(figures(3, errors=3), stable, policy)

    assert verdict == ROLL_BACK
    assert reason == (
        "3 of 3 request(s) to the new revision failed: above the allowed error rate "
        "(1.0% and 1 point(s) more) even if its next 17 succeeded"
    )
    assert judge(figures(3, errors=1), stable, policy)[0] == ROLL_BACK
    assert judge(figures(19, errors=0), stable, policy)[0] == INCONCLUSIVE
    # 0.4 of 20 requests may fail: none of 3 failing, too few to tell yet.
    assert judge(figures(3), stable, policy)[0] == INCONCLUSIVE
    # Within the allowance at min_requests (2 of 20 against 2.0%, with 10 points more).
    lenient = RolloutPolicy(min_requests=20, max_error_rate_increase=0.1)
    assert judge(figures(3, errors=2), figures(400, errors=8), lenient)[0] == INCONCLUSIVE
    # Without the other side's figures there is nothing to judge against.
    assert judge(figures(3, errors=3), figures(5), policy)[0] == INCONCLUSIVE
    assert judge(figures(3, errors=3), None, policy)[0] == INCONCLUSIVE


@pytest.mark.parametrize(
    "named",
    ["rollout-other-r2", "rollout-llama-r9", "rollout-llama-r1", "rollout-llama-r02"],
)
def test_an_undo_naming_a_rollout_the_model_never_had_says_so_and_records_nothing(
    named: str,
) -> None:
    cluster = serving()
    revise(cluster)
    run(cluster)

    with pytest.raises(InvalidOperation) as refused:
        rollouts.undo(cluster.state, "llama", named)

    assert str(refused.value).startswith(
        f"rollout {named} cannot be undone: model llama never had it (its rollouts are named "
        "rollout-llama-r<revision>, and its revisions go up to 2); the model's rollout is "
        "rollout-llama-r2, revision 1 -> 2, succeeded, started at "
    )
    started = cluster.state.models["llama"].rollout.started_at  # type: ignore[union-attr]
    assert f"started at {utc_text(started)}; nothing was recorded" in str(refused.value)
    assert cluster.state.models["llama"].revision == 2
