"""`llmgw-cli history ...`: everything the log recorded about one replica, node, model, key or
certificate.

Exit codes: 0 events shown, 1 failed (no such events, the API unreachable or refusing, or
paging without end), 2 bad usage (a bad flag, an unusable config file).
"""

from __future__ import annotations

from typing import Annotated, Literal

from cyclopts import App, Parameter

from cli.arguments import WholeNumberWithin
from cli.client import AdminClient, EventView
from cli.config import ConnectionFlags
from cli.history_pages import NEWEST, HistoryEvent, history
from cli.operator import run_command
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    Column,
    counted,
    print_error,
    print_json_array,
    print_table,
    utc_seconds,
)

history_app = App(
    name="history",
    help="""Show what the event log recorded about one replica, node, model, API key or
certificate: who did what, when, and which operation (correlation id) it belonged to.

Events are printed oldest first; --limit N shows the newest N.

```
llmgw-cli history replica demo-1
llmgw-cli history node dev-node-1 --limit 20
llmgw-cli history key ci --output json | jq -r '.[].actor'
```
""",
)

Output = Annotated[
    Literal["table", "wide", "json"],
    Parameter(
        help="table for people (columns that do not fit the terminal are left out, in a "
        "stated order); wide for every column however wide; json prints the events as the "
        "API returns them."
    ),
]
Limit = Annotated[
    int | None,
    Parameter(
        converter=WholeNumberWithin(1, NEWEST),
        help="Show only the newest N events (of those after --after), still oldest first, "
        "as tail -n does. [default: all]",
    ),
]
After = Annotated[
    int,
    Parameter(
        converter=WholeNumberWithin(0, NEWEST),
        help="Show only events after this log position (the position column of a listing).",
    ),
]

COLUMNS = (
    Column("position", justify="right", key=True),
    Column("time (UTC)", drop=2),
    Column("event", drop=3),
    Column("actor"),
    Column("what", wrap=True),
    Column("correlation", wrap=True, drop=1),
)


def event_row(view: EventView) -> tuple[str, ...]:
    """One event as a row of ``COLUMNS`` (``llmgw-cli events`` prints the same rows)."""
    return (
        str(view.position),
        utc_seconds(view.recorded_at),
        view.type,
        view.actor,
        view.summary,
        view.correlation_id or "",
    )


@history_app.command(name="replica")
def replica_history(
    replica_id: Annotated[str, Parameter(help="The replica id, such as llama-3-8b-2.")],
    /,
    *,
    output: Output = "table",
    limit: Limit = None,
    after: After = 0,
    connection: ConnectionFlags | None = None,
) -> int:
    """Every event about one replica: placement, shards starting, ready or failed (with
    the engine's log tail in --output json, or the node's reason for refusing the start,
    "start refused: ..."), serving, drains, stops.

    ```
    llmgw-cli history replica llama-3-8b-2
    llmgw-cli history replica llama-3-8b-2 --output json | jq '.[].data.log_tail'
    ```
    """
    return show_history("replica", replica_id, output, limit, after, connection)


@history_app.command(name="node")
def node_history(
    node_id: Annotated[str, Parameter(help="The node id its agent claims.")],
    /,
    *,
    output: Output = "table",
    limit: Limit = None,
    after: After = 0,
    connection: ConnectionFlags | None = None,
) -> int:
    """Every event about one node: registration, connections, GPU health, cordons, drains,
    the shards it ran, and connections refused while claiming its id.

    ```
    llmgw-cli history node gpu-08
    ```
    """
    return show_history("node", node_id, output, limit, after, connection)


@history_app.command(name="model")
def model_history(
    model: Annotated[str, Parameter(help="The model name.")],
    /,
    *,
    output: Output = "table",
    limit: Limit = None,
    after: After = 0,
    connection: ConnectionFlags | None = None,
) -> int:
    """Every event about one model: declarations, scaling, tuning, why it could not be
    placed, and its replicas' placements. --limit 20: the latest 20 of them.

    ```
    llmgw-cli history model qwen-2-7b --limit 20
    ```
    """
    return show_history("model", model, output, limit, after, connection)


@history_app.command(name="key")
def key_history(
    key: Annotated[
        str,
        Parameter(
            help="The API key by its id (k-7f3a9c21), prefix (7f3a9c21) or name (ci), as "
            "`keys list` shows them; never its secret."
        ),
    ],
    /,
    *,
    output: Output = "table",
    limit: Limit = None,
    after: After = 0,
    connection: ConnectionFlags | None = None,
) -> int:
    """When an API key was created and revoked, and by whom.

    A name names the live key of that name, else the one of that name revoked last.

    ```
    llmgw-cli history key ci
    llmgw-cli history key 7f3a9c21 --output json
    ```
    """
    return show_history("key", key, output, limit, after, connection)


@history_app.command(name="certificate")
def certificate_history(
    serial: Annotated[
        str,
        Parameter(
            help="The certificate's serial, as `cert show` or `cert list` print it (0x and "
            "colons are taken)."
        ),
    ],
    /,
    *,
    output: Output = "table",
    limit: Limit = None,
    after: After = 0,
    connection: ConnectionFlags | None = None,
) -> int:
    """When one certificate was revoked by its serial, by whom and why. A node's
    certificates revoked all at once (cert revoke --node) are in the node's history.

    ```
    llmgw-cli history certificate 5f1c0a9e3b7d24c81e6f90a3b5d7c2e4f1a8b603
    ```
    """
    return show_history("certificate", serial, output, limit, after, connection)


def show_history(
    subject: str,
    key: str,
    output: Literal["table", "wide", "json"],
    limit: int | None,
    after: int,
    flags: ConnectionFlags | None,
) -> int:
    command = f"history {subject}"

    def show(client: AdminClient) -> int:
        events = history(client, subject, key, after=after, limit=limit)
        if output == "json":
            print_json_array(event.raw for event in events)
        elif events:
            print_table(
                COLUMNS,
                (event_row(event.view) for event in events),
                title=_title(subject, key, events),
                wide=output == "wide",
            )
        if not events:
            print_error(
                command,
                f"no events for {subject} {key}" + (f" after position {after}" if after else ""),
            )
            return EXIT_FAILED
        return EXIT_OK

    return run_command(command, flags, show)


def _title(subject: str, key: str, events: list[HistoryEvent]) -> str:
    count = counted(len(events), "event")
    return f"{subject} {key}: {count}"
