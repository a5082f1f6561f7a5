"""`llmgw-cli drain-cancel <drain-id> [--wait]`: call a drain off.

The API records the cancellation at once; a node drain's moves under way are then called
off by the reconciler's next pass, which ends the drain as cancelled. ``--wait`` follows it
until then, as ``drain-progress --wait`` does. Either way a node drain's cordon stays, and
the command ends saying how to lift it.
"""

from __future__ import annotations

from typing import Annotated

from cyclopts import Parameter

from cli.arguments import segment
from cli.client import ADMIN, AdminClient
from cli.config import ConnectionFlags
from cli.drain import watch
from cli.operator import Output, call, run_command
from cli.render import EXIT_OK, print_json, say
from cli.views import DrainChange
from cli.waiting import WaitTimeout, check_wait_timeout


def drain_cancel(
    drain_id: Annotated[str, Parameter(help="The drain's id, as drain printed it.")],
    /,
    *,
    wait: Annotated[
        bool,
        Parameter(
            negative=(),
            help=(
                "Follow the drain until it has ended as cancelled (exit 0), or as what it "
                "ended as first (exit 1 for a failure, as when --timeout runs out)."
            ),
        ),
    ] = False,
    timeout: WaitTimeout = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Call a drain off (a node's or a replica's). Each move still under way is called
    off: its original serves on and counts again, and a replacement already placed for it
    is stopped as beyond its model's count. What the drain moved already stays moved. A
    drained node stays cordoned: uncordon it once it may take replicas again. Cancelling a
    drain that was cancelled already changes nothing; one that ended otherwise is refused
    with how it ended (exit 1). `drain --wait` and `drain-progress --wait` of the drain
    then end, saying it was cancelled (exit 1: the node was not emptied).

    ```
    llmgw-cli drain-cancel drain-3f2a9c1e
    llmgw-cli drain-cancel drain-3f2a9c1e --wait
    llmgw-cli uncordon gpu-08
    ```
    """

    def cancel(client: AdminClient) -> int:
        check_wait_timeout(timeout, wait)
        path = f"{ADMIN}/drains/{segment(drain_id, 'the drain id')}/cancel"
        reply = call(client, DrainChange, "POST", path)
        if wait:
            code = watch(
                "drain-cancel", client, drain_id, output, cancelling=True, timeout_s=timeout
            )
            node_id = reply.value.drain.node_id
            if code == EXIT_OK and output != "json" and node_id is not None:
                say(_stays_cordoned(node_id))
            return code
        if output == "json":
            print_json(reply.raw)
        else:
            for line in cancelled_lines(reply.value):
                say(line)
        return EXIT_OK

    return run_command("drain-cancel", connection, cancel)


def cancelled_lines(change: DrainChange) -> list[str]:
    """What the cancellation did, and what is left to the operator."""
    drain = change.drain
    lines = [
        f"{drain.drain_id}: cancelled; its moves under way are called off"
        if change.changed
        else f"{drain.drain_id}: cancelled already, nothing recorded"
    ]
    if drain.node_id is not None:
        lines.append(_stays_cordoned(drain.node_id))
    if not drain.finished:
        lines.append(f"follow it: llmgw-cli drain-progress {drain.drain_id} --wait")
    return lines


def _stays_cordoned(node_id: str) -> str:
    """What is left to the operator: the drain's cordon outlives it."""
    return (
        f"node {node_id} stays cordoned: llmgw-cli uncordon {node_id} once it may take "
        "replicas again"
    )
