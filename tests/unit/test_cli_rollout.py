"""How ``llmgw-cli rollout status`` shows a rollout: one line per change for logs (a hold's
countdown is no change), and the whole status for people, with the way to see where the
next replacement would go while one is coming; and what ``rollout undo`` says it did."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from msgspec.structs import replace
from rich.console import Console

from cli.rollout import undone_text
from cli.rollout_render import render, summary_line
from cli.rollout_views import CanaryTrafficView, RolloutStepView, RolloutView
from cli.views import MoveView, ReplicaTrafficView

HOLDING = RolloutView(
    model="llama",
    rollout_id="rollout-llama-r3",
    state="running",
    revision=3,
    from_revision=2,
    model_revision=3,
    step=0,
    step_started_at=datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
    steps=[
        RolloutStepView(replicas=1, target=1, traffic=0.1, hold_s=300.0),
        RolloutStepView(replicas="all", target=4),
    ],
    hold_left_s=120.4,
    desired=4,
    replicas_by_revision={"2": {"serving": 3}, "3": {"serving": 1}},
    max_surge=1,
    max_failures=2,
)


def shown(view: RolloutView, width: int = 100) -> str:
    output = io.StringIO()
    Console(file=output, width=width, highlight=False, color_system=None).print(render(view))
    return output.getvalue()


def test_a_line_per_change_leaves_the_countdown_of_a_hold_out() -> None:
    later = replace(HOLDING, hold_left_s=60.0)

    line = summary_line(HOLDING)

    assert line == summary_line(later)
    assert line == (
        "rollout-llama-r3 running | step 1 of 2: 1 of 4 replica(s) on revision 3, 10 % of the "
        "traffic, hold 300s (holding) | rev 3: 1 serving; rev 2: 3 serving"
    )


def test_a_move_under_way_and_the_pause_reason_are_in_the_line() -> None:
    moving = replace(
        HOLDING,
        state="paused",
        pause_reason="night freeze",
        hold_left_s=None,
        moves=[
            MoveView(replica_id="llama-2", revision=2, replacement_id="llama-6"),
            MoveView(replica_id="llama-3", revision=2),
            MoveView(replica_id="llama-4", revision=2, waiting_for="0 eligible of 2"),
        ],
    )

    line = summary_line(moving)

    assert "moves: llama-2 (rev 2) -> llama-6 None; llama-3 (rev 2) -> not placed yet" not in line
    assert "moves: llama-2 (rev 2) -> llama-6; llama-3 (rev 2) -> not placed yet; " in line
    assert "llama-4 (rev 2) -> not placed yet (0 eligible of 2) |" in line
    assert line.endswith("| paused: night freeze")


def test_the_status_says_where_the_next_replacement_would_go_only_while_one_may_come() -> None:
    # The step after the canary's: 4 replicas of revision 3, one of them serving so far.
    promoted = replace(HOLDING, step=1, hold_left_s=None)
    holding = shown(HOLDING)
    finished = shown(replace(HOLDING, state="succeeded", finished=True, hold_left_s=None))

    assert holding.splitlines()[:3] == [
        "rollout-llama-r3: running, revision 2 -> 3",
        "step:     1 of 2: 1 of 4 replica(s) on revision 3, 10 % of the traffic, hold 300s (120s "
        "left)",
        "replicas: rev 3: 1 serving; rev 2: 3 serving",
    ]
    assert "next replacement: llmgw-cli explain-placement llama shows where it" in shown(promoted)
    # The canary step has its one replica: nothing more is placed while it holds.
    assert "explain-placement" not in holding
    assert "explain-placement" not in finished


def test_the_status_points_to_the_next_replacement_only_when_one_will_be_placed() -> None:
    promoted = replace(HOLDING, step=1, hold_left_s=None)
    paused = replace(promoted, state="paused", pause_reason="night freeze")
    waiting_move = replace(paused, moves=[MoveView(replica_id="llama-2", revision=2)])
    placed_move = replace(
        paused, moves=[MoveView(replica_id="llama-2", revision=2, replacement_id="llama-6")]
    )
    all_coming = replace(
        promoted, replicas_by_revision={"3": {"serving": 1, "starting": 2, "placed": 1}}
    )
    rolling_back = replace(HOLDING, state="rolling_back", model_revision=2, hold_left_s=None)
    rolled_back_home = replace(
        rolling_back, replicas_by_revision={"2": {"serving": 4}, "3": {"stopping": 1}}
    )

    def points(view: RolloutView) -> bool:
        return "explain-placement" in shown(view)

    assert points(promoted)
    assert not points(paused), "a paused rollout starts no move"
    assert points(waiting_move), "a move started before the pause still places its replacement"
    assert not points(placed_move)
    assert not points(all_coming), "every replica the step wants is placed already"
    assert points(rolling_back), "revision 2 is one replica short of the 4 it brings back"
    assert not points(rolled_back_home)


def test_the_canary_share_is_said_only_while_the_gateways_split_the_traffic() -> None:
    # The gateways split a model's requests only while replicas of both sides are routed to.
    split = replace(HOLDING, canary=CanaryTrafficView(revision=3, share=0.5))
    alone = replace(split, replicas_by_revision={"3": {"serving": 1}, "2": {"stopping": 3}})
    not_yet = replace(split, replicas_by_revision={"3": {"starting": 1}, "2": {"serving": 3}})

    assert "canary:   revision 3 gets 50 % of the traffic\n" in shown(split, width=200)
    assert "canary:   revision 3 gets all of the traffic: no replica of another revision " in (
        shown(alone, width=200)
    )
    assert "gets 50 %" not in shown(alone, width=200)
    assert "canary:   revision 3 is to get 50 % of the traffic once a replica of it serves" in (
        shown(not_yet, width=200)
    )


def test_the_step_of_a_rollout_undone_says_what_it_was_to_run_not_that_it_runs() -> None:
    # Undone at its last step before any replica of revision 4 was placed.
    undone = replace(
        HOLDING,
        rollout_id="rollout-llama-r4",
        state="rolled_back",
        finished=True,
        revision=4,
        from_revision=3,
        model_revision=3,
        step=1,
        hold_left_s=None,
        replicas_by_revision={"3": {"serving": 4}},
    )

    said = shown(undone, width=200)

    assert ": 4 of 4 replica(s) on revision 4" not in said
    assert (
        "step:     2 of 2, where it stopped: it was to run 4 of 4 replica(s) on revision 4"
    ) in said
    assert "step 2 of 2, where it stopped: it was to run 4 of 4" in summary_line(undone)


def test_the_status_says_what_the_verdict_of_a_holding_step_waits_for_with_the_counts() -> None:
    waiting = replace(
        HOLDING,
        verdict_waits_for="TTFT p95 from 3 sample(s) of the new revision and 400 of the "
        "others, fewer than min_latency_samples 50",
    )

    said = " ".join(shown(waiting, width=200).split())

    assert (
        "waiting: no verdict on these figures yet: TTFT p95 from 3 sample(s) of the new "
        "revision and 400 of the others, fewer than min_latency_samples 50"
    ) in said
    assert "waiting:" not in shown(HOLDING)


def test_the_status_names_the_replicas_ejected_during_the_hold() -> None:
    ejected = replace(HOLDING, hold_ejections={"llama-9": 1, "llama-5": 2})

    said = " ".join(shown(ejected, width=200).split())

    assert (
        "ejected: llama-5 (by 2 gateway(s)), llama-9 (by 1 gateway(s)) during the step's "
        "hold, for failing requests in a row"
    ) in said
    assert "ejected:" not in shown(HOLDING)


def test_undo_after_a_rollout_that_succeeded_names_the_revision_it_replaced() -> None:
    # Rollout 1 -> 2 succeeded; undo declared revision 1's spec again as revision 3.
    again = replace(HOLDING, step_started_at=None, hold_left_s=None)

    said = undone_text(again)

    assert said == "rollout-llama-r3: the spec before revision 2 rolls out again as revision 3"
    assert "revision 2's spec" not in said
    assert undone_text(replace(again, state="succeeded", finished=True)) == (
        "rollout-llama-r3: the spec before revision 2 rolled out again as revision 3"
    )


def test_undo_says_a_rollout_rolled_back_before_the_answer_was_read_is_back_already() -> None:
    rolling = replace(HOLDING, rollout_id="rollout-llama-r2", revision=2, from_revision=1)
    done = replace(rolling, state="rolled_back", finished=True, model_revision=1)

    assert undone_text(replace(rolling, state="rolling_back", model_revision=1)) == (
        "rollout-llama-r2: rolling back to revision 1; its replicas of revision 2 are replaced"
    )
    assert undone_text(done) == (
        "rollout-llama-r2: rolled back to revision 1; no replica of revision 2 is left"
    )


def test_the_status_of_a_model_left_without_replicas_does_not_blame_the_gateways() -> None:
    # The gateways measure active replicas only: none active is no silence of theirs.
    ended = replace(
        HOLDING, state="ended", finished=True, replicas_by_revision={}, traffic_by_revision={}
    )
    silent = replace(HOLDING, traffic_by_revision={})

    assert "traffic: none: the model has no active replica" in shown(ended)
    assert "no gateway reports" not in shown(ended)
    assert "traffic: no gateway reports in the last 5 s" in shown(silent)


def test_the_status_says_which_revision_s_figures_a_crowded_report_may_lack() -> None:
    figures = {
        "3": ReplicaTrafficView(gateways=2, requests=4, error_rate=0.0, unlisted=1),
        "2": ReplicaTrafficView(gateways=2, requests=900, error_rate=0.0),
    }

    lines = shown(replace(HOLDING, traffic_by_revision=figures)).splitlines()

    at = lines.index("  rev 3: 4 requests, 0 % failed")
    assert lines[at + 1 : at + 3] == [
        "    partial: 1 gateway's report may have left replicas of it out",
        "  rev 2: 900 requests, 0 % failed",
    ]
