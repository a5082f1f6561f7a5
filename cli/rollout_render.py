"""How ``llmgw-cli rollout`` shows a rollout: the whole status for people (also the live
view of ``rollout status --wait``), one line of it for logs, and a model's past rollouts."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from cli.render import styled, text, utc_seconds
from cli.rollout_views import UNDER_WAY, CanaryTrafficView, RolloutRecordView, RolloutView
from cli.traffic import revision_lines, traffic_title

STATE_STYLES = {
    "running": "yellow",
    "paused": "bold yellow",
    "rolling_back": "red",
    "succeeded": "green",
    "rolled_back": "red",
    "ended": "dim",
    "superseded": "dim",
}


def state_text(state: str) -> str:
    return state.replace("_", " ")


CARRIED_OUT = ("running", "paused", "succeeded")
"""The states of a rollout whose step is, or was last, carried out as declared: in the others
it stopped where it was (rolled back, or its model removed)."""

ROUTED_PHASES = ("serving", "draining")
"""The phases of the replicas the gateways route to, those a canary split is made of."""

COUNTING_PHASES = ("placed", "starting", "serving")
"""The phases of the replicas that count towards a step, as the reconciler counts them."""


def step_text(view: RolloutView, *, hold_left: bool = True) -> str:
    """``2 of 3: 1 of 4 replicas on revision 3, 10 % of the traffic, hold 300s (42s left)``;
    for a rollout that stopped (``2 of 3, where it stopped: it was to run ...``)."""
    step = view.current_step
    if step is None:
        return f"{view.step + 1} of {len(view.steps)}"
    if view.state not in CARRIED_OUT:
        # Its step's count is what the step was to reach, not what runs (an undo, say).
        return (
            f"{view.step + 1} of {len(view.steps)}, where it stopped: it was to run "
            f"{step.target} of {view.desired} replica(s) on revision {view.revision}"
        )
    said = (
        f"{view.step + 1} of {len(view.steps)}: {step.target} of {view.desired} replica(s) "
        f"on revision {view.revision}"
    )
    if step.traffic is not None:
        said += f", {step.traffic * 100:g} % of the traffic"
    if step.hold_s:
        said += f", hold {step.hold_s:g}s"
        if view.hold_left_s is not None:
            said += f" ({view.hold_left_s:.0f}s left)" if hold_left else " (holding)"
    if view.step_started_at is None and not view.finished:
        said += " (not started yet)"
    return said


def replicas_text(view: RolloutView) -> str:
    """``rev 3: 1 serving, 1 starting; rev 2: 3 serving``, newest revision first."""
    parts = []
    for revision, phases in sorted(view.replicas_by_revision.items(), key=lambda i: -int(i[0])):
        counts = ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items()))
        parts.append(f"rev {revision}: {counts}")
    return "; ".join(parts) or "none active"


def moves_text(view: RolloutView) -> str:
    """``llama-2 (rev 2) -> llama-5 starting``, each move; empty when none runs."""
    return "; ".join(
        f"{m.replica_id} (rev {m.revision}) -> "
        + " ".join(filter(None, (m.replacement_id, m.replacement_phase)))
        if m.replacement_id
        else f"{m.replica_id} (rev {m.revision}) -> not placed yet"
        + (f" ({m.waiting_for})" if m.waiting_for else "")
        for m in view.moves
    )


def failures_text(view: RolloutView) -> str:
    said = f"{view.failures} of {view.max_failures} that roll it back"
    return said + (f"; last: {view.last_failure}" if view.last_failure else "")


def summary_line(view: RolloutView) -> str:
    """The rollout in one line that changes only when the rollout does (the hold's
    countdown left out): what ``rollout status --wait`` prints when not on a terminal."""
    parts = [
        f"{view.rollout_id} {state_text(view.state)}",
        f"step {step_text(view, hold_left=False)}",
        replicas_text(view),
    ]
    if view.moves:
        parts.append(f"moves: {moves_text(view)}")
    if view.failures:
        parts.append(f"failures: {failures_text(view)}")
    if view.state == "paused" and view.pause_reason:
        parts.append(f"paused: {view.pause_reason}")
    if view.verdict:
        parts.append(f"verdict {view.verdict}")
    if view.outcome:
        parts.append(f"outcome: {view.outcome}")
    return " | ".join(parts)


def hold_ejections_text(view: RolloutView) -> str:
    """The replicas the gateways ejected during the step's hold, each with the most gateways
    that did at once: the step's verdict counts them, even those back in rotation."""
    shown = ", ".join(
        f"{replica} (by {gateways} gateway(s))"
        for replica, gateways in sorted(view.hold_ejections.items())
    )
    return f"{shown} during the step's hold, for failing requests in a row"


def render(view: RolloutView) -> RenderableType:
    """The whole status: what it brings in, its step, replicas by revision, moves,
    failures, the last verdict, the gateways' figures per revision, and where the next
    replacement would go."""
    header = styled(
        (view.rollout_id, "bold"),
        ": ",
        (state_text(view.state), STATE_STYLES.get(view.state, "")),
        f", revision {view.from_revision} -> {view.revision}",
        f" (model {view.model} at revision {view.model_revision})"
        if view.model_revision != view.revision
        else "",
    )
    facts: list[tuple[str, str]] = []
    if view.undoes is not None:
        facts.append(("undoes", f"{view.undoes} (an undo names this rollout to undo it)"))
    if view.started_at is not None:
        facts.append(("started", f"{utc_seconds(view.started_at)} UTC"))
    facts.append(("step", step_text(view)))
    facts.append(("replicas", replicas_text(view)))
    pace = f"max_surge {view.max_surge}, max_unavailable {view.max_unavailable}"
    facts.append(("moves", f"{moves_text(view) or 'none under way'} ({pace})"))
    facts.append(("failures", failures_text(view)))
    if view.hold_ejections:
        facts.append(("ejected", hold_ejections_text(view)))
    if view.canary is not None:
        facts.append(("canary", canary_text(view, view.canary)))
    if view.verdict_waits_for:
        facts.append(("waiting", f"no verdict on these figures yet: {view.verdict_waits_for}"))
    if view.verdict:
        facts.append(("verdict", view.verdict))
    if view.state == "paused":
        facts.append(("paused", view.pause_reason or "-"))
    if view.outcome:
        facts.append(("outcome", view.outcome))
    if view.finished_at is not None:
        facts.append(("finished", f"{utc_seconds(view.finished_at)} UTC"))
    lines: list[RenderableType] = [header, *fact_lines(facts)]
    lines.extend(_traffic(view))
    if replacement_coming(view):
        lines.append(
            text(
                f"next replacement: llmgw-cli explain-placement {view.model} shows where it "
                "would go and why other nodes would not",
                style="dim",
            )
        )
    return Group(*lines)


def canary_text(view: RolloutView, canary: CanaryTrafficView) -> str:
    """The canary's share as the gateways apply it: only while replicas of its revision and
    of another are routed to; with one side alone, that side takes every request."""
    share = f"{canary.share * 100:g} %"
    routed = {
        revision: sum(phases.get(phase, 0) for phase in ROUTED_PHASES)
        for revision, phases in view.replicas_by_revision.items()
    }
    on_canary = routed.get(str(canary.revision), 0)
    others = sum(n for revision, n in routed.items() if revision != str(canary.revision))
    if on_canary and others:
        return f"revision {canary.revision} gets {share} of the traffic"
    if on_canary:
        return (
            f"revision {canary.revision} gets all of the traffic: no replica of another "
            f"revision serves ({share} once one does)"
        )
    return (
        f"revision {canary.revision} is to get {share} of the traffic once a replica of it serves"
    )


def replacement_coming(view: RolloutView) -> bool:
    """Whether the rollout will place a replacement: a move of it waits for one, or its step
    (all replicas, when rolling back) wants more replicas of the model's revision than run
    or are coming. A paused rollout starts no move, and a finished one none at all."""
    if view.state not in UNDER_WAY:
        return False
    if any(m.replacement_id is None for m in view.moves):
        return True
    step = view.current_step
    if view.state == "rolling_back":
        wanted = view.desired
    elif view.state == "running" and step is not None:
        wanted = step.target
    else:
        return False
    phases = view.replicas_by_revision.get(str(view.model_revision), {})
    return sum(phases.get(phase, 0) for phase in COUNTING_PHASES) < wanted


def _traffic(view: RolloutView) -> list[Text]:
    by_revision = view.traffic_by_revision
    if not by_revision and not view.replicas_by_revision:
        return [styled(("traffic:", "bold"), " none: the model has no active replica")]
    if not by_revision:
        return [styled(("traffic:", "bold"), " no gateway reports in the last 5 s")]
    title = traffic_title(next(iter(by_revision.values())))
    lines = [text(title.replace("traffic (", "traffic by revision (", 1) + ":", "bold")]
    for revision, figures in sorted(by_revision.items(), key=lambda i: -int(i[0])):
        lines.extend(text(f"  {line}") for line in revision_lines(revision, figures))
    return lines


def fact_lines(facts: Sequence[tuple[str, str]]) -> list[Text]:
    """``name: value`` lines, values aligned; values are plain text, escaped, never markup."""
    width = max((len(name) for name, _ in facts), default=0) + 2
    return [styled((f"{name}:".ljust(width), "bold"), value or "-") for name, value in facts]


def render_record(record: RolloutRecordView) -> RenderableType:
    """One past rollout: what it brought in, who started it, its steps and verdicts."""
    started = utc_seconds(record.started_at) + " UTC" if record.started_at else "?"
    header = styled(
        (record.rollout_id, "bold"),
        f": revision {record.from_revision} -> {record.revision}, ",
        (state_text(record.state), STATE_STYLES.get(record.state, "")),
        f"; started {started} by {record.started_by}",
    )
    lines: list[RenderableType] = [header]
    if record.changes_summary:
        lines.append(text(f"  changed: {record.changes_summary}"))
    # Each summary begins by what it is about, which the header has said already.
    about = f"rollout {record.rollout_id} "
    for event in record.events:
        what = event.summary.partition(about)[2] or event.summary
        lines.append(text(f"  {utc_seconds(event.recorded_at)}  {event.actor:<10} {what}"))
    if record.state == "superseded":  # no event of its own says so
        lines.append(text(f"  {record.outcome}"))
    return Group(*lines)
