"""`llmgw-cli replicas [--model M] [--node N] [--phase P] [--all]` and `replica <id>`."""

from __future__ import annotations

from typing import Annotated, Literal

from cyclopts import Parameter

from cli import replica_pages
from cli.arguments import filled, segment
from cli.client import ADMIN, AdminClient
from cli.config import ConnectionFlags
from cli.operator import Output, print_facts, run_command, show_one
from cli.render import (
    EXIT_OK,
    Column,
    make_console,
    print_json_array,
    print_table,
    text,
    utc_seconds,
    warn,
)
from cli.replica_pages import ENDED_PHASES
from cli.traffic import print_traffic
from cli.views import ReplicaSummary, ReplicaView

Phase = Literal[
    "placed",
    "starting",
    "serving",
    "draining",
    "stopping",
    "stopped",
    "failed",
    "timed_out",
    "lost",
]


def list_replicas(
    *,
    model: Annotated[
        str | None, Parameter(converter=filled, help="Only this model's replicas.")
    ] = None,
    node: Annotated[
        str | None, Parameter(converter=filled, help="Only replicas with a shard on this node.")
    ] = None,
    phase: Annotated[
        Phase | None,
        Parameter(help="Only replicas in this phase (an ended one lists ended replicas)."),
    ] = None,
    all_replicas: Annotated[
        bool,
        Parameter(
            name="--all",
            negative=(),
            help="Ended replicas too (stopped, failed, timed_out, lost): the log keeps every one.",
        ),
    ] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """The replicas that exist (not ended; --all: every replica the log knows, ended ones
    too), by model and number, with their phase, nodes (with any GPU of theirs whose UUID
    another node holds: gpu-09 (GPU 0 held elsewhere)), whether they are routed to (and how
    many live gateways eject them for failing requests: yes (ejected by 2 of 3 gateways)),
    and the drain moving them if one is. A --phase of an ended phase (stopped, failed,
    timed_out, lost) lists those ended replicas. A --model or --node the cluster does not
    know is an error (exit 1); a known model or node without replicas lists nothing. The
    replicas are read from the admin API 500 at a time, page after page (a page repeating
    a replica listed already fails the command), and printed as one list (--output json:
    one JSON array).

    ```
    llmgw-cli replicas --model llama-3-8b
    llmgw-cli replicas --node gpu-08 --phase serving
    llmgw-cli replicas --all --model llama-3-8b
    llmgw-cli replicas --phase failed --output json | jq -r '.[].id'
    ```
    """
    ended = all_replicas or phase in ENDED_PHASES
    filters = {"model": model, "node": node, "phase": phase}
    given = {name: value for name, value in filters.items() if value is not None}

    def show(client: AdminClient) -> int:
        listing = replica_pages.list_replicas(client, given, ended=ended)
        listed = listing.replicas
        if not listed:
            _require_known_names(client, model, node)
        if output == "json":
            print_json_array(replica.raw for replica in listed)
            return EXIT_OK
        rows = (replica_row(replica.view) for replica in listed)
        print_table(REPLICA_COLUMNS, rows, wide=output == "wide")
        # A server that does not say whether any was left out may have left some out.
        if listing.ended_left_out is not False:
            warn(ENDED_NOT_SHOWN)
        return EXIT_OK

    return run_command("replicas", connection, show)


ENDED_NOT_SHOWN = "(ended replicas not shown: --all lists them too)"


def _require_known_names(client: AdminClient, model: str | None, node: str | None) -> None:
    """Raise the API's 404 (``no model 'nope' is known``, ``no node 'nope' is known``) when
    ``model`` or ``node`` names nothing the cluster knows. The list answers an empty 200 for
    such a filter, as for a known model or node without replicas, so the model and the node
    themselves are asked, and only when the list came back empty."""
    if model is not None:
        client.request("GET", f"{ADMIN}/models/{segment(model, 'the model name')}")
    if node is not None:
        client.request("GET", f"{ADMIN}/nodes/{segment(node, 'the node id')}")


REPLICA_COLUMNS = (
    Column("replica", key=True),
    Column("model", drop=3),  # the replica's id begins with it
    Column("phase"),
    Column("revision"),
    Column("nodes", key=True),
    Column("serving since (UTC)", drop=1),
    Column("routable", wrap=True, drop=2),
    Column("moves", wrap=True),
)


def replica_row(replica: ReplicaSummary) -> tuple[str, ...]:
    return (
        replica.id,
        replica.model,
        replica.phase,
        revision_text(replica),
        nodes_text(replica),
        utc_seconds(replica.serving_since) if replica.serving_since else "",
        routable_text(replica),
        moves(replica),
    )


def nodes_text(replica: ReplicaSummary) -> str:
    """Its nodes, each with its GPUs whose UUID another node holds if any: ``gpu-08,gpu-09
    (GPU 0 held elsewhere)``; ``llmgw-cli replica ID`` names the node that holds each."""
    return ",".join(
        node_id + _held_elsewhere_marker(replica.held_elsewhere_gpus.get(node_id, []))
        for node_id in replica.nodes
    )


def _held_elsewhere_marker(indexes: list[int]) -> str:
    if not indexes:
        return ""
    listed = ",".join(map(str, indexes))
    return f" (GPU{'s' if len(indexes) > 1 else ''} {listed} held elsewhere)"


def routable_text(replica: ReplicaSummary) -> str:
    """Whether the control plane routes to it, and how many live gateways eject it if any
    does: ``yes (ejected by 2 of 3 gateways)``."""
    routable = "yes" if replica.routable else "no"
    ejection = replica.ejection
    if ejection is None or ejection.ejected_by == 0:
        return routable
    return f"{routable} (ejected {ejected_text(replica)})"


def ejected_text(replica: ReplicaSummary) -> str | None:
    """``by 2 of 3 gateways``: how many live gateways keep it out of their rotation for
    failing; None when no live gateway reports ejections."""
    ejection = replica.ejection
    if ejection is None:
        return None
    plural = "" if ejection.gateways == 1 else "s"
    by = "none" if ejection.ejected_by == 0 else str(ejection.ejected_by)
    return f"by {by} of {ejection.gateways} gateway{plural}"


def revision_text(replica: ReplicaSummary) -> str:
    """The revision it runs, and its model's when that is newer: ``1 (current 2)``. A
    replica keeps the revision it was placed with until it is replaced."""
    current = replica.current_revision
    if current is not None and current != replica.revision:
        return f"{replica.revision} (current {current})"
    return str(replica.revision)


def moves(replica: ReplicaSummary) -> str:
    said = []
    if replica.drain_id is not None:
        said.append(f"drained by {replica.drain_id}")
    if replica.replaces is not None:
        said.append(f"replaces {replica.replaces}")
    if replica.replacement_id is not None:
        said.append(f"replaced by {replica.replacement_id}")
    return "; ".join(said)


def show_replica(
    replica_id: Annotated[str, Parameter(help="The replica id, such as llama-3-8b-2.")],
    /,
    *,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """One replica: its phase and why, every shard with its node, GPUs (and any whose UUID
    another node holds), port, state and error, the engine's last log lines of a shard
    that failed, and what the gateways measured of its requests over the last minute
    (requests, errors, the ones its clients cancelled and those they abandoned before any
    answer, TTFT, TPOT).

    ```
    llmgw-cli replica llama-3-8b-2
    ```
    """

    def path() -> str:
        return f"{ADMIN}/replicas/{segment(replica_id, 'the replica id')}"

    return show_one("replica", path, ReplicaView, print_replica, output, connection)


def print_replica(replica: ReplicaView, wide: bool = False) -> None:
    console = make_console()
    facts: list[tuple[str, str | None]] = [
        ("replica", replica.id),
        ("model", replica.model),
        ("phase", replica.phase + (f" ({replica.reason})" if replica.reason else "")),
        ("revision", _revision_fact(replica)),
        ("routable", "yes" if replica.routable else "no"),
    ]
    if (ejected := ejected_text(replica)) is not None:
        facts.append(("ejected", ejected))
    if replica.serving_since is not None:
        facts.append(("serving", f"since {utc_seconds(replica.serving_since)} UTC"))
    if replica.ended_at is not None:
        facts.append(("ended", f"{utc_seconds(replica.ended_at)} UTC: {replica.end_reason}"))
    if said := moves(replica):
        facts.append(("moves", said))
    facts.extend(("held elsewhere", text) for text in held_elsewhere_texts(replica))
    print_facts(facts, console)
    print_table(
        (
            Column("shard", justify="right"),
            Column("node", key=True),
            Column("GPUs"),
            Column("port", justify="right"),
            Column("state"),
            Column("pid", justify="right"),
            Column("error", wrap=True),
        ),
        (
            (
                str(s.index),
                s.node_id,
                ",".join(str(g) for g in s.gpus),
                str(s.port),
                s.phase,
                "" if s.pid is None else str(s.pid),
                _error(s.error, s.exit_code) or _stopped_by_agent(s.stop_reason),
            )
            for s in replica.shards
        ),
        title="shards",
        console=console,
        wide=wide,
    )
    for shard in replica.shards:
        if shard.log_tail:
            console.print(text(f"engine log of shard {shard.index} (last lines):", "bold"))
            for line in shard.log_tail:
                console.print(text(f"  {line}"), soft_wrap=True)
    print_traffic(replica.traffic, console)


def held_elsewhere_texts(replica: ReplicaView) -> list[str]:
    """``shard 0 on gpu-09, GPU 0: its UUID ... is listed by node gpu-07 too, connected
    longer``, for each GPU of its shards another node holds: that node's engine may not be
    where it says."""
    return [
        f"shard {shard.index} on {shard.node_id}, GPU {gpu.index}: {gpu.reason}"
        for shard in replica.shards
        for gpu in shard.gpus_held_elsewhere
    ]


def _revision_fact(replica: ReplicaView) -> str:
    text = revision_text(replica)
    if text == str(replica.revision):
        return text
    return f"{text}: it runs the spec it was placed with until it is replaced"


def _stopped_by_agent(reason: str | None) -> str:
    return "" if reason is None else f"stopped by its agent: {reason}"


def _error(error: str | None, exit_code: int | None) -> str:
    """The shard's error, and its exit code unless the error says how the engine ended
    already (the agent's own words: ``engine exited with code 1: ...``, ``engine was
    killed by SIGKILL``), where the code would only be said twice."""
    if error is None:
        return ""
    if exit_code is None or _says_how_it_ended(error, exit_code):
        return error
    return f"{error} (exit code {exit_code})"


def _says_how_it_ended(error: str, exit_code: int) -> bool:
    if exit_code < 0:
        return error.startswith("engine was killed by ")
    return error.startswith(f"engine exited with code {exit_code}")
