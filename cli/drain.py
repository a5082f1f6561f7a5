"""`llmgw-cli drain <node> [--require-room] | --replica <id>` and `drain-progress <drain-id>`
(a drain is called off by `drain-cancel <drain-id>`, ``cli.drain_cancel``).

A drain answers at once with its id (a node drain also with the replicas that have nowhere
to go now, printed as warnings); ``--wait`` then follows it until it is done: a live
view on a terminal (rich Live), one line per step of the drain elsewhere (logs, CI).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Annotated

import msgspec
from cyclopts import Parameter
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from cli.arguments import NumberWithin, segment
from cli.client import ADMIN, AdminClient, ApiProblem, ClientError, EventView
from cli.config import ConnectionFlags
from cli.operator import Output, Reply, call, run_command
from cli.render import (
    EVENT_TYPE_WIDTH,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    make_console,
    print_error,
    print_json,
    say,
    styled,
    text,
    utc_seconds,
    warn,
)
from cli.replicas import moves
from cli.views import DrainAccepted, DrainProgressView, ReplicaRoomView
from cli.waiting import Deadline, WaitTimeout, check_wait_timeout

POLL_INTERVAL_S = 0.5
EVENTS_SHOWN = 8
NO_ROOM_SHOWN = 32
"""The most replicas with nowhere to go a drain names, one line each."""
NO_ROOM_REFUSED = "no-room-to-drain"
"""The admin API's problem for a node drain ``require_room`` refused."""

Wait = Annotated[
    bool,
    Parameter(
        help=(
            "Follow the drain until it is done: exit 0 when it completes, 1 if it fails, "
            "an operator cancels it (llmgw-cli drain-cancel) or --timeout runs out."
        ),
        negative=(),
    ),
]


def drain(
    node_id: Annotated[str | None, Parameter(help="The node to drain.")] = None,
    /,
    *,
    replica: Annotated[
        str | None, Parameter(help="Drain this one serving replica instead of a node.")
    ] = None,
    grace: Annotated[
        float | None,
        Parameter(
            converter=NumberWithin(0, above_low=True),
            help="Seconds a node drain may take; what is left then is stopped. [default: 600]",
        ),
    ] = None,
    require_room: Annotated[
        bool,
        Parameter(
            negative=(),
            help=(
                "Refuse a node drain, recording nothing, when a replica on the node has "
                "nowhere to go now (exit 1, each such replica named with placement's "
                "reason). Without it such a drain is recorded with a warning per replica: "
                "when the grace runs out, what is still on the node is stopped, not moved."
            ),
        ),
    ] = False,
    wait: Wait = False,
    timeout: WaitTimeout = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Move replicas off a node (or move one replica) without dropping a request: a
    replacement is placed elsewhere, and each original keeps serving until its replacement
    serves. The node is cordoned first, so nothing new lands on it. With --wait, a live
    view of every move until the drain is done (one line per step when not on a terminal;
    the final progress as JSON with --output json).

    A node drain first says, on stderr, which replicas have nowhere to go now (placement
    finds no room for their replacement, each counted against the others): unless room
    appears, those are stopped, not moved, when the grace runs out. --require-room
    refuses such a drain instead. A drain can be called off while it runs
    (llmgw-cli drain-cancel ID).

    ```
    llmgw-cli drain gpu-08 --wait --timeout 900
    llmgw-cli drain gpu-08 --require-room
    llmgw-cli drain --replica llama-3-8b-2
    ```
    """
    if (node_id is None) == (replica is None):
        print_error("drain", "give a node, or --replica ID (one of the two)")
        return EXIT_USAGE
    if replica is not None and grace is not None:
        print_error("drain", "--grace applies to a node drain; a replica drain has its own")
        return EXIT_USAGE
    if replica is not None and require_room:
        print_error("drain", "--require-room applies to a node drain")
        return EXIT_USAGE

    def start(client: AdminClient) -> int:
        check_wait_timeout(timeout, wait)
        if node_id is not None:
            path = f"{ADMIN}/nodes/{segment(node_id, 'the node id')}/drain"
            body: dict[str, object] | None = {} if grace is None else {"grace_s": grace}
            if require_room:
                body = {**(body or {}), "require_room": True}
        else:
            path = f"{ADMIN}/replicas/{segment(replica or '', 'the replica id')}/drain"
            body = None
        try:
            accepted = call(client, DrainAccepted, "POST", path, body=body)
        except ApiProblem as refused:
            lines = no_room_refusal(node_id, refused) if node_id is not None else None
            if lines is None:
                raise
            print_error("drain", lines[0])
            for line in lines[1:]:
                warn(line)
            return EXIT_FAILED
        for line in no_room_warnings(accepted.value):
            warn(line)
        if wait:
            return watch("drain", client, accepted.value.drain_id, output, timeout_s=timeout)
        if output == "json":
            print_json(accepted.raw)
        else:
            drain_id = accepted.value.drain_id
            what = f"node {node_id}" if node_id is not None else f"replica {replica}"
            say(f"{drain_id}: draining {what}")
            say(f"follow it: llmgw-cli drain-progress {drain_id} --wait")
            say(f"call it off: llmgw-cli drain-cancel {drain_id}")
        return EXIT_OK

    return run_command("drain", connection, start)


def no_room_warnings(accepted: DrainAccepted) -> list[str]:
    """One line per replica of a node drain that has nowhere to go now, with placement's
    reason and what its grace then does to it (at most ``NO_ROOM_SHOWN``, then how many
    more)."""
    grace = (
        f"when the {accepted.grace_s:g}s grace runs out"
        if accepted.grace_s is not None
        else "when the grace runs out"
    )
    shown, more = _without_room(accepted.room)
    lines = [f"warning: {nowhere_to_go(room)}; {grace} it is stopped, not moved" for room in shown]
    if more:
        lines.append(
            f"warning: and {more} more replica(s) with nowhere to go; {grace} they "
            "are stopped, not moved"
        )
    return lines


def no_room_refusal(node_id: str, refused: ApiProblem) -> list[str] | None:
    """What to print for a node drain that ``--require-room`` refused: a line that says
    so, then one per replica with nowhere to go, as the warnings of a drain that goes ahead
    name them (at most ``NO_ROOM_SHOWN``, then how many more). None for another problem,
    or a refusal whose ``room`` is not the API's list: its detail then says it all."""
    if refused.title != NO_ROOM_REFUSED:
        return None
    try:
        room = msgspec.convert(refused.extra.get("room"), list[ReplicaRoomView])
    except msgspec.ValidationError:
        return None
    shown, more = _without_room(room)
    if not shown:
        return None
    lines = [
        f"node {node_id} was not drained: {len(shown) + more} of {len(room)} replica(s) on "
        "it have nowhere to go now; nothing was recorded",
        *(f"  {nowhere_to_go(r)}" for r in shown),
    ]
    if more:
        lines.append(f"  and {more} more replica(s) with nowhere to go")
    return lines


def nowhere_to_go(room: ReplicaRoomView) -> str:
    """``llama-2 has nowhere to go now: REASON (llmgw-cli explain-placement llama)``."""
    hint = f" (llmgw-cli explain-placement {room.model})" if room.model else ""
    return f"{room.replica_id} has nowhere to go now: {room.reason or 'no reason given'}{hint}"


def _without_room(room: Sequence[ReplicaRoomView]) -> tuple[list[ReplicaRoomView], int]:
    """The first ``NO_ROOM_SHOWN`` replicas with nowhere to go, and how many more there are:
    the list is the server's, and a node holds a few replicas, not thousands."""
    nowhere = [r for r in room if not r.has_room]
    return nowhere[:NO_ROOM_SHOWN], max(0, len(nowhere) - NO_ROOM_SHOWN)


def drain_progress(
    drain_id: Annotated[str, Parameter(help="The drain's id, as drain printed it.")],
    /,
    *,
    wait: Wait = False,
    timeout: WaitTimeout = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """How a drain is going: the replicas it moves and their replacements, what is still on
    the node, its latest steps. Exits 1 for a drain that failed or was cancelled
    (llmgw-cli drain-cancel).

    ```
    llmgw-cli drain-progress drain-3f2a9c1e --wait
    ```
    """

    def show(client: AdminClient) -> int:
        check_wait_timeout(timeout, wait)
        # Read before the wait: a drain that is not known is said to be so, not to go on.
        progress = _progress(client, drain_id)
        if wait:
            return watch(
                "drain-progress", client, drain_id, output, first=progress, timeout_s=timeout
            )
        if output == "json":
            print_json(progress.raw)
        else:
            make_console().print(render(progress.value))
        return _exit_code(progress.value)

    return run_command("drain-progress", connection, show)


def watch(
    command: str,
    client: AdminClient,
    drain_id: str,
    output: Output,
    *,
    first: Reply[DrainProgressView] | None = None,
    cancelling: bool = False,
    timeout_s: float | None = None,
) -> int:
    """Poll the drain's progress until it is finished, or ``timeout_s`` runs out; show it
    as it goes. The drain is known to exist (it was just accepted, or ``first`` is its
    progress, read already): a failure while polling leaves it going on, and the message
    says so. The exit code is ``_exit_code``'s, except that one ``cancelling`` the drain
    has its cancellation as its success, and a drain still going when the time ran out is
    a failure (exit 1), said so on stderr (with ``--output json``, its progress then on
    stdout)."""
    console = make_console()
    deadline = Deadline(timeout_s)
    try:
        if output == "json":
            progress = _poll_until_finished(client, drain_id, lambda _: None, first, deadline)
            print_json(progress.raw)
        elif console.is_terminal:
            with Live(console=console, auto_refresh=False) as live:
                progress = _poll_until_finished(
                    client,
                    drain_id,
                    lambda p: live.update(render(p), refresh=True),
                    first,
                    deadline,
                )
        else:
            shown: set[int | str] = set()
            progress = _poll_until_finished(
                client, drain_id, lambda p: print_new_steps(console, p, shown), first, deadline
            )
            console.print(render(progress.value, steps=False))  # each step is printed already
    except ClientError as exc:
        raise ClientError(
            f"{exc} (the drain goes on: llmgw-cli drain-progress {drain_id} --wait)"
        ) from exc
    if not progress.value.finished:
        print_error(
            command,
            f"{drain_id} is still {progress.value.state.replace('_', ' ')} (--timeout ran "
            f"out); it goes on: llmgw-cli drain-progress {drain_id} --wait",
        )
        return EXIT_FAILED
    if cancelling and cancelled(progress.value):
        return EXIT_OK
    code = _exit_code(progress.value)
    if code != EXIT_OK:
        ended = "was cancelled" if cancelled(progress.value) else "failed"
        print_error(command, f"{drain_id} {ended}: {progress.value.outcome}")
    return code


def _poll_until_finished(
    client: AdminClient,
    drain_id: str,
    show: Callable[[DrainProgressView], None],
    first: Reply[DrainProgressView] | None,
    deadline: Deadline,
) -> Reply[DrainProgressView]:
    """The drain's progress once it is finished, or as it was when ``deadline`` passed."""
    progress = first or _progress(client, drain_id)
    while True:
        show(progress.value)
        if progress.value.finished or deadline.passed():
            return progress
        time.sleep(deadline.left_s(POLL_INTERVAL_S))
        progress = _progress(client, drain_id)


def _progress(client: AdminClient, drain_id: str) -> Reply[DrainProgressView]:
    return call(
        client, DrainProgressView, "GET", f"{ADMIN}/drains/{segment(drain_id, 'the drain id')}"
    )


def succeeded(progress: DrainProgressView) -> bool:
    """The API says: a node drain that moved every replica, a replica drain whose replicas
    were each replaced."""
    return progress.state == "succeeded"


def cancelled(progress: DrainProgressView) -> bool:
    """An operator called the drain off (llmgw-cli drain-cancel)."""
    return progress.state == "cancelled"


def _exit_code(progress: DrainProgressView) -> int:
    return EXIT_OK if not progress.finished or succeeded(progress) else EXIT_FAILED


def print_new_steps(console: Console, progress: DrainProgressView, shown: set[int | str]) -> None:
    """Each step not printed yet, then each wait for a replacement not printed yet (once
    per reason: a drain stuck for want of room says so once, not every poll)."""
    for event in progress.events:
        if event.position not in shown:
            shown.add(event.position)
            console.print(text(_step(event)), soft_wrap=True)
    for line in waiting_lines(progress):
        if line not in shown:
            shown.add(line)
            console.print(text(line), soft_wrap=True)


def waiting_lines(progress: DrainProgressView) -> list[str]:
    """One line per move of a running drain whose replacement is not placed yet, with why,
    and what happens when the grace runs out."""
    if progress.finished:
        return []
    models = {r.id: r.model for r in progress.replicas}
    lines = []
    for move in progress.moves:
        if move.replacement_id is not None:
            continue
        why = move.waiting_for or "placement has not run yet"
        model = models.get(move.replica_id)
        hint = f" (llmgw-cli explain-placement {model})" if move.waiting_for and model else ""
        lines.append(f"{move.replica_id} waits for a replacement: {why}{hint}")
    if lines and progress.grace_ends_at is not None:
        lines.append(
            f"at {utc_seconds(progress.grace_ends_at)} UTC the grace runs out: what is still "
            "on the node then is stopped, not moved"
        )
    return lines


def _step(event: EventView) -> str:
    return f"{utc_seconds(event.recorded_at)}  {event.type:<{EVENT_TYPE_WIDTH}} {event.summary}"


def render(progress: DrainProgressView, *, steps: bool = True) -> RenderableType:
    """The drain's state, its replicas and (with ``steps``) its latest steps."""
    what = f"node {progress.node_id}" if progress.node_id is not None else "one replica"
    requested = (
        f", requested by {progress.requested_by} at {utc_seconds(progress.requested_at)} UTC"
        if progress.requested_at is not None
        else ""
    )
    grace = f", grace {progress.grace_s:g}s" if progress.grace_s is not None else ""
    if not progress.finished:
        state = ("moving", "yellow")
    elif succeeded(progress):
        state = (f"done: {progress.outcome}", "green")
    elif cancelled(progress):
        state = (f"{progress.outcome}", "yellow")
    else:
        state = (f"failed: {progress.outcome}", "red")
    parts: list[RenderableType] = [
        styled((f"{progress.drain_id}", "bold"), f" drains {what}{requested}{grace}: ", state)
    ]
    if progress.still_on_node:
        called_off = set(progress.moves_called_off)
        staying = (
            f"{r} (its move called off)" if r in called_off else r for r in progress.still_on_node
        )
        parts.append(text(f"still on the node: {', '.join(staying)}"))
    parts.extend(text(line, style="yellow") for line in waiting_lines(progress))
    if progress.replicas:
        replicas = Table(title="replicas", title_justify="left", header_style="bold")
        for header in ("replica", "model", "phase", "nodes", "moves"):
            replicas.add_column(header)
        for r in progress.replicas:
            row = (r.id, r.model, r.phase, ",".join(r.nodes), moves(r))
            replicas.add_row(*(text(c) for c in row))
        parts.append(replicas)
    elif not progress.finished:
        # A finished drain's outcome says it already ("no replica was serving on the node").
        parts.append(text("no replica was on the node"))
    if steps:
        latest = Table(title="latest steps", title_justify="left", header_style="bold")
        for header in ("time (UTC)", "event", "what"):
            latest.add_column(header)
        for event in progress.events[-EVENTS_SHOWN:]:
            latest.add_row(
                text(utc_seconds(event.recorded_at)), text(event.type), text(event.summary)
            )
        parts.append(latest)
    return Group(*parts)
