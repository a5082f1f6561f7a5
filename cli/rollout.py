"""`llmgw-cli rollout status|pause|resume|undo|history MODEL`: follow and steer the rollout
that a spec change starts (docs/rollouts.md).

``status --wait`` follows the rollout until it finishes or pauses: a live view on a
terminal (rich Live), one line per change elsewhere (logs, CI), and an exit code that says
how it ended.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated

from cyclopts import App, Parameter, Token
from rich.live import Live

from cli.arguments import (
    MAX_REASON_LENGTH,
    ArgumentRefused,
    WholeNumberWithin,
    one_line_reason,
    segment,
)
from cli.client import ADMIN, AdminClient, ApiProblem, ClientError
from cli.config import ConnectionFlags
from cli.operator import Output, Reply, call, run_command
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    make_console,
    print_error,
    print_json,
    say,
    text,
    utc_seconds,
)
from cli.rollout_render import render, render_record, step_text, summary_line
from cli.rollout_views import RolloutChange, RolloutHistoryView, RolloutView
from cli.waiting import Deadline, WaitTimeout, check_wait_timeout

POLL_INTERVAL_S = 1.0

EXIT_PAUSED = 3
"""``status --wait`` found the rollout paused: it goes nowhere until an operator resumes or
undoes it, so a script waiting on it (a CI pipeline) is told, rather than left hanging.
Apart from 1 so that the script can tell "ask someone" from "it failed"."""

ROLLOUT_ID = re.compile(r"^rollout-[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?-r[1-9][0-9]{0,9}$")
"""A rollout's id as the admin API accepts one (``rollout-<model>-r<revision>``). The CLI
cannot import the API's pattern, so it is written again (a test holds the two equal)."""


def rollout_id(_type: object, tokens: Sequence[Token]) -> str:
    """cyclopts' converter for ``--rollout``: an id of the shape every rollout has, so a
    typo is bad usage (exit 2), not a refusal quoting the API's pattern."""
    if not ROLLOUT_ID.fullmatch(tokens[0].value):
        raise ArgumentRefused(
            "must be a rollout's id as `llmgw-cli rollout status` names it "
            f"(rollout-MODEL-rREVISION, such as rollout-llama-3-8b-r2), got {tokens[0].value!r}"
        )
    return tokens[0].value


ModelName = Annotated[str, Parameter(help="The model whose rollout it is, such as llama-3-8b.")]

rollout_app = App(
    name="rollout",
    help="""Follow and steer a model's rollout. A spec change that alters what runs (its
command, env, engine, GPUs, shards or node selector) is a new revision, and a rollout
replaces the model's replicas with it step by step, as the spec's `rollout` policy says,
judging each canary step by what the gateways measured (docs/rollouts.md).

```
llmgw-cli rollout status llama-3-8b --wait
llmgw-cli rollout pause llama-3-8b --reason 'TTFT looks high'
llmgw-cli rollout undo llama-3-8b
llmgw-cli rollout history llama-3-8b
```
""",
)


@rollout_app.command(name="status")
def rollout_status(
    model: ModelName,
    /,
    *,
    wait: Annotated[
        bool,
        Parameter(
            help="Follow the rollout until it finishes: exit 0 when it succeeded, 1 when it "
            "was rolled back, ended with its model's removal, or was superseded by a newer "
            "revision's (or --timeout ran out); 3 as soon as it is paused, saying why and "
            "what moves it on (a paused rollout waits for an operator's resume or undo).",
            negative=(),
        ),
    ] = False,
    timeout: WaitTimeout = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """How the model's rollout is going (or how its last one ended): its step of how
    many, the step's replicas, traffic share and hold, the replicas of each revision by
    phase, the moves under way with their replacements, failures, the last verdict, what
    the gateways measured of each revision, and, while a step holds, the replicas the
    gateways ejected for failing during its hold (the verdict counts them, even those back
    in rotation) and what its verdict would still wait for (too few requests or latency
    samples, with the counts). Exits 0,
    or 1 when the rollout finished without succeeding (rolled back, or ended with its
    model's removal). With --wait, a live view until it finishes or pauses (one line per
    change when not on a terminal; the final status as JSON with --output json); a paused
    rollout ends the wait with exit 3.

    ```
    llmgw-cli rollout status llama-3-8b
    llmgw-cli rollout status llama-3-8b --wait --timeout 3600
    ```
    """

    def show(client: AdminClient) -> int:
        check_wait_timeout(timeout, wait)
        if wait:
            return _follow(client, model, output, timeout)
        reply = _status(client, model)
        if output == "json":
            print_json(reply.raw)
        else:
            make_console().print(render(reply.value))
        view = reply.value
        return EXIT_FAILED if view.finished and view.state != "succeeded" else EXIT_OK

    return run_command("rollout status", connection, show)


@rollout_app.command(name="pause")
def pause(
    model: ModelName,
    /,
    *,
    reason: Annotated[
        str,
        Parameter(
            converter=one_line_reason,
            help=f"Why, for the log: one line of at most {MAX_REASON_LENGTH} characters.",
        ),
    ] = "",
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Pause the model's rollout where it is: moves under way finish, no new one starts,
    no verdict is reached. Pausing a paused rollout records nothing (and says why it is
    paused); one rolling back or finished cannot be paused (exit 1).

    ```
    llmgw-cli rollout pause llama-3-8b --reason 'TTFT looks high'
    ```
    """
    body = {"reason": reason} if reason else None

    def said(view: RolloutView, changed: bool) -> str:
        if not changed:
            # Paused already, by its verdict or an operator: this reason was not recorded,
            # so say the one that stands.
            why = f" ({view.pause_reason})" if view.pause_reason else ""
            return f"{view.rollout_id}: already paused{why}, nothing recorded"
        return (
            f"{view.rollout_id}: paused at step {step_text(view)}; moves under way finish, "
            f"no new one starts (llmgw-cli rollout resume {model} goes on)"
        )

    return _steer("pause", model, body, said, output, connection)


@rollout_app.command(name="resume")
def resume(
    model: ModelName, /, *, output: Output = "table", connection: ConnectionFlags | None = None
) -> int:
    """Resume the model's paused rollout. A step paused because its verdict could not be
    reached (too few requests) is promoted: the operator's word stands for the verdict.
    Resuming a running rollout records nothing; one rolling back or finished cannot be
    resumed (exit 1).

    ```
    llmgw-cli rollout resume llama-3-8b
    ```
    """

    def said(view: RolloutView, changed: bool) -> str:
        if not changed:
            return f"{view.rollout_id}: already running, nothing recorded"
        if view.promoted:
            # The operator's word stood for the verdict: the step is over, not resumed.
            return (
                f"{view.rollout_id}: resumed, step {view.step + 1} of {len(view.steps)} "
                f"promoted (its verdict was not reached: the resume stands for it); step "
                f"{view.step + 2} starts"
            )
        return f"{view.rollout_id}: resumed at step {step_text(view)}"

    return _steer("resume", model, None, said, output, connection)


@rollout_app.command(name="undo")
def undo(
    model: ModelName,
    /,
    *,
    rollout: Annotated[
        str | None,
        Parameter(
            converter=rollout_id,
            help="The rollout to undo, as `rollout status` names it (rollout-llama-3-8b-r2): "
            "refused when it is not the model's rollout any more, so running the same "
            "command twice undoes once. Needed to undo a rollout an undo started. "
            "[default: the model's rollout, unless an undo started it]",
        ),
    ] = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Back to the revision before. A rollout under way is rolled back: the model is at
    its old revision again, its old replicas were never touched, and its replicas of the
    new one are replaced. After a rollout that succeeded, the old revision is declared
    again as the next revision and rolled out like any other. A rollout rolling back or
    rolled back already cannot be undone (exit 1).

    A repeated undo changes nothing (exit 1): without --rollout, a rollout that an undo
    started is not undone (the message names the rollout undone already), so running the
    same command twice never puts the newer revision back; with --rollout, one that is
    not the model's rollout any more is refused. To undo an undo, name its rollout with
    --rollout; to go on to another spec, declare it (`llmgw-cli models apply`).

    ```
    llmgw-cli rollout undo llama-3-8b
    llmgw-cli rollout undo llama-3-8b --rollout rollout-llama-3-8b-r2
    ```
    """

    body = None if rollout is None else {"rollout_id": rollout}
    return _steer("undo", model, body, lambda view, _: undone_text(view), output, connection)


def undone_text(view: RolloutView) -> str:
    """What ``undo`` did, from the rollout in its answer: the one rolled back, or the new
    rollout of the spec the succeeded one replaced. That spec's own revision is not in the
    answer (the new rollout's ``from_revision`` is the revision it replaces), so it is
    named by the revision that came after it."""
    if view.state == "rolling_back":
        return (
            f"{view.rollout_id}: rolling back to revision {view.from_revision}; its "
            f"replicas of revision {view.revision} are replaced"
        )
    if view.state == "rolled_back":
        return (
            f"{view.rollout_id}: rolled back to revision {view.from_revision}; no replica "
            f"of revision {view.revision} is left"
        )
    verb = "rolled out again" if view.state == "succeeded" else "rolls out again"
    return (
        f"{view.rollout_id}: the spec before revision {view.from_revision} {verb} as "
        f"revision {view.revision}"
    )


@rollout_app.command(name="history")
def history(
    model: ModelName,
    /,
    *,
    limit: Annotated[
        int,
        Parameter(
            help="Show the N latest rollouts.",
            converter=WholeNumberWithin(1, 100),
        ),
    ] = 20,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """The model's rollouts, newest first, as the log tells them: what each revision
    changed and who declared it, each step, hold and verdict with the figures it judged,
    pauses, resumes, rollbacks, and how it ended.

    ```
    llmgw-cli rollout history llama-3-8b
    llmgw-cli rollout history llama-3-8b --output json | jq '.rollouts[0].events'
    ```
    """

    def show(client: AdminClient) -> int:
        path = f"{ADMIN}/models/{segment(model, 'the model name')}/rollouts"
        reply = call(client, RolloutHistoryView, "GET", path, params={"limit": limit})
        if output == "json":
            print_json(reply.raw)
            return EXIT_OK
        if not reply.value.rollouts:
            print_error("rollout history", f"model {model} has had no rollout")
            return EXIT_FAILED
        console = make_console()
        for record in reply.value.rollouts:
            console.print(render_record(record), soft_wrap=True)
        return EXIT_OK

    return run_command("rollout history", connection, show)


def _steer(
    action: str,
    model: str,
    body: object,
    said: Callable[[RolloutView, bool], str],
    output: Output,
    flags: ConnectionFlags | None,
) -> int:
    def change(client: AdminClient) -> int:
        path = f"{ADMIN}/models/{segment(model, 'the model name')}/rollout/{action}"
        reply = call(client, RolloutChange, "POST", path, body=body)
        if output == "json":
            print_json(reply.raw)
            return EXIT_OK
        say(said(reply.value.rollout, reply.value.changed))
        if reply.value.changed:
            say(f"follow it: llmgw-cli rollout status {model} --wait")
        return EXIT_OK

    return run_command(f"rollout {action}", flags, change)


def _status(client: AdminClient, model: str) -> Reply[RolloutView]:
    return call(
        client, RolloutView, "GET", f"{ADMIN}/models/{segment(model, 'the model name')}/rollout"
    )


def _follow(client: AdminClient, model: str, output: Output, timeout_s: float | None) -> int:
    """Poll the rollout until it finishes (or pauses, is superseded, or ``timeout_s`` runs
    out); show it as it goes."""
    console = make_console()
    first = _status(client, model)
    followed = first.value.rollout_id
    deadline = Deadline(timeout_s)
    shown: list[str] = []

    def show_line(view: RolloutView) -> None:
        line = summary_line(view)
        if not shown or shown[-1] != line:
            shown.append(line)
            console.print(text(f"{utc_seconds_now()}  {line}"), soft_wrap=True)

    def until_done(show: Callable[[RolloutView], None]) -> Reply[RolloutView]:
        reply = first
        while True:
            if reply.value.rollout_id != followed:
                return reply
            show(reply.value)
            if reply.value.finished or reply.value.state == "paused":
                return reply
            if deadline.passed():
                return reply
            time.sleep(deadline.left_s(POLL_INTERVAL_S))
            reply = _status(client, model)

    try:
        if output == "json":
            last = until_done(lambda _: None)
            print_json(last.raw)
        elif console.is_terminal:
            with Live(console=console, auto_refresh=False) as live:
                last = until_done(lambda view: live.update(render(view), refresh=True))
        else:
            last = until_done(show_line)
    except ClientError as exc:
        goes_on = f"(the rollout goes on: llmgw-cli rollout status {model} --wait)"
        if isinstance(exc, ApiProblem):
            raise ApiProblem(
                exc.status, f"{exc} {goes_on}", exc.errors, title=exc.title, extra=exc.extra
            ) from exc
        raise ClientError(f"{exc} {goes_on}") from exc
    return _ending(model, followed, last.value)


def _ending(model: str, followed: str, view: RolloutView) -> int:
    if view.rollout_id != followed:
        print_error(
            "rollout status",
            f"{followed} was superseded by {view.rollout_id} (revision {view.revision}); "
            f"follow it: llmgw-cli rollout status {model} --wait",
        )
        return EXIT_FAILED
    if view.state == "paused":
        # A paused rollout does not go on by itself: following it on would leave a script,
        # or the operator, waiting on what only a resume or an undo ends.
        why = f" ({view.pause_reason})" if view.pause_reason else ""
        print_error(
            "rollout status",
            f"{followed} is paused{why} and waits for an operator: "
            f"llmgw-cli rollout resume {model} goes on, llmgw-cli rollout undo {model} "
            "rolls it back",
        )
        return EXIT_PAUSED
    if not view.finished:
        print_error(
            "rollout status",
            f"{followed} is still {view.state.replace('_', ' ')} (--timeout ran out); it goes "
            f"on: llmgw-cli rollout status {model} --wait",
        )
        return EXIT_FAILED
    if view.state == "succeeded":
        return EXIT_OK
    print_error("rollout status", f"{followed} {view.state.replace('_', ' ')}: {view.outcome}")
    return EXIT_FAILED


def utc_seconds_now() -> str:
    return utc_seconds(datetime.now(UTC))
