"""`llmgw-cli nodes`, `node <id>`, `cordon <node> [--gpu N]`, `uncordon <node> [--gpu N]`."""

from __future__ import annotations

from typing import Annotated

from cyclopts import Parameter

from cli.arguments import MAX_REASON_LENGTH, WholeNumberWithin, one_line_reason, segment
from cli.client import ADMIN, AdminClient
from cli.config import ConnectionFlags
from cli.operator import (
    Output,
    get_nodes,
    labels_text,
    post_change,
    print_facts,
    run_command,
    show_one,
    yes_no,
)
from cli.render import (
    EXIT_OK,
    Column,
    counted,
    make_console,
    print_json,
    print_table,
    utc_seconds,
)
from cli.views import NodeChange, NodeSummary, NodeView, UnlistedGpuCordonView

NodeId = Annotated[str, Parameter(help="The node id its agent claims, such as gpu-08.")]
MAX_GPU_INDEX = 9999
"""The highest GPU index the admin API reads in a path (four digits)."""

GpuIndex = Annotated[
    int | None,
    Parameter(
        name="--gpu",
        converter=WholeNumberWithin(0, MAX_GPU_INDEX),
        help="One GPU of the node, by its index (as `llmgw-cli node NODE` lists it), "
        "rather than the whole node.",
    ),
]


NODE_COLUMNS = (
    Column("node", key=True),
    Column("state"),
    Column("GPUs healthy/total", justify="right"),
    Column("free", justify="right"),
    Column("replicas", justify="right"),
    Column("address", drop=2),
    Column("labels", wrap=True, drop=3),
)

DISCONNECTED_COLUMN = Column("disconnected", wrap=True, drop=1)
"""Why a node away lost its connection, as ``llmgw-cli node`` says it; the first column
left out of a terminal too narrow for all."""


def node_columns(nodes: list[NodeSummary], wide: bool) -> tuple[Column, ...]:
    """The list's columns: ``disconnected`` too with ``--output wide``, or when a node away
    says why (a column empty in every row is no use to the default table)."""
    if wide or any(n.disconnect_reason for n in nodes):
        return (*NODE_COLUMNS, DISCONNECTED_COLUMN)
    return NODE_COLUMNS


def node_row(node: NodeSummary) -> tuple[str, ...]:
    return (
        node.id,
        node_state(node.connected, node.lost, node.cordoned, node.drain_id)
        + gpus_cordoned_text(node.cordoned_gpus)
        + gpus_held_elsewhere_text(node.held_elsewhere_gpus),
        f"{node.healthy_gpus}/{node.gpus}",
        str(node.free_gpus),
        str(node.replicas),
        node.address,
        labels_text(node.labels),
        "" if node.connected else node.disconnect_reason or "",
    )


GPU_COLUMNS = (
    Column("GPU", justify="right"),
    # Whole, on one line, as `nvidia-smi -L` and the node's history write it (a UUID is one
    # word, so it is never folded); where the terminal is too narrow for it, it goes last.
    Column("UUID", drop=3),
    # The same model on nearly every node: it goes first, before the replica using a GPU.
    Column("name", drop=1),
    Column("memory used/total MiB", justify="right"),
    Column("healthy"),
    Column("used by", drop=2),
    Column("excluded because", wrap=True),
)
"""A node's GPUs in ``llmgw-cli node NODE``: with their UUIDs and a reason, 93 columns wide
once the name and what uses them are left out."""


def list_nodes(*, output: Output = "table", connection: ConnectionFlags | None = None) -> int:
    """Every node the log knows: connection (and why a node away lost it), cordon and
    drain, GPUs (healthy and free, and those cordoned or whose UUID another node holds),
    how many replicas run there.

    ```
    llmgw-cli nodes
    llmgw-cli nodes --output json | jq -r '.[] | select(.free_gpus > 0) | .id'
    ```
    """

    def show(client: AdminClient) -> int:
        reply = get_nodes(client)
        if output == "json":
            print_json(reply.raw)
            return EXIT_OK
        wide = output == "wide"
        columns = node_columns(reply.value, wide)
        print_table(
            columns,
            (node_row(n)[: len(columns)] for n in reply.value),
            title=counted(len(reply.value), "node"),
            wide=wide,
        )
        return EXIT_OK

    return run_command("nodes", connection, show)


def show_node(
    node_id: NodeId, /, *, output: Output = "table", connection: ConnectionFlags | None = None
) -> int:
    """One node: its connection, labels, every GPU (its index and full UUID, as
    `nvidia-smi -L` and the node's history name it) with its memory and health (and why
    placement will not use it), its cordon or drain, the replicas on it. A terminal too
    narrow for every column leaves out the GPUs' name, then what uses them, then their
    UUID, and says so; `--output wide` shows them all.

    ```
    llmgw-cli node gpu-08
    ```
    """

    def path() -> str:
        return f"{ADMIN}/nodes/{segment(node_id, 'the node id')}"

    return show_one("node", path, NodeView, print_node, output, connection)


def cordon(
    node_id: NodeId,
    /,
    *,
    gpu: GpuIndex = None,
    reason: Annotated[
        str,
        Parameter(
            converter=one_line_reason,
            help=f"Why, for whoever reads the history: one line of at most {MAX_REASON_LENGTH} "
            "characters.",
        ),
    ] = "",
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Place nothing new on a node, or with --gpu on one GPU of it; what runs there keeps
    running (drain moves it). A cordoned node or GPU cordoned again with another reason
    keeps the new one (its history says who changed it); with the same reason, or none,
    nothing is recorded and the reason it has is shown. A node being drained is already
    cordoned by its drain: its cordon is refused, and the reason is not recorded.

    ```
    llmgw-cli cordon gpu-08 --reason "ECC errors on GPU 3"
    llmgw-cli cordon gpu-08 --gpu 3 --reason "ECC errors"
    ```
    """
    if gpu is not None:
        return _gpu_change("cordon", node_id, gpu, {"reason": reason}, output, connection)
    return post_change(
        "cordon",
        lambda: f"{ADMIN}/nodes/{segment(node_id, 'the node id')}/cordon",
        NodeChange,
        {"reason": reason},
        output,
        connection,
        done=lambda answer: f"node {node_id}: cordoned: {cordon_reason_text(answer.node)}",
        unchanged=lambda answer: _already_cordoned(node_id, answer.node),
    )


def _already_cordoned(node_id: str, node: NodeView) -> str:
    return _unchanged_cordon(f"node {node_id}:", f"cordoned: {cordon_reason_text(node)}")


def _unchanged_cordon(subject: str, cordon_now: str) -> str:
    """What a cordon or uncordon that changed nothing says, of a node or of a GPU: one
    form (``node gpu-1: GPU 0 already uncordoned; nothing recorded``), the semicolon
    because a cordon's reason may hold commas."""
    return f"{subject} already {cordon_now}; nothing recorded"


def uncordon(
    node_id: NodeId,
    /,
    *,
    gpu: GpuIndex = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Allow placements on a node again (after a cordon or a finished drain), or with
    --gpu on one GPU of it.

    ```
    llmgw-cli uncordon gpu-08
    llmgw-cli uncordon gpu-08 --gpu 3
    ```
    """
    if gpu is not None:
        return _gpu_change("uncordon", node_id, gpu, None, output, connection)
    return _change("uncordon", node_id, None, output, connection)


def _gpu_change(
    command: str,
    node_id: str,
    gpu: int,
    body: object,
    output: Output,
    connection: ConnectionFlags | None,
) -> int:
    """``cordon``/``uncordon`` of the node's GPU ``gpu``, saying its cordon now."""

    def path() -> str:
        return f"{ADMIN}/nodes/{segment(node_id, 'the node id')}/gpus/{gpu}/{command}"

    def cordon_now(answer: NodeChange) -> str:
        listed = next((g for g in answer.node.gpus if g.index == gpu), None)
        if listed is None or not listed.cordoned:
            return "uncordoned"
        reason = listed.cordon_reason or "no reason given"
        return f"cordoned by {listed.cordoned_by}: {reason}"

    return post_change(
        command,
        path,
        NodeChange,
        body,
        output,
        connection,
        done=lambda answer: f"node {node_id}: GPU {gpu} {cordon_now(answer)}",
        unchanged=lambda answer: _unchanged_cordon(
            f"node {node_id}: GPU {gpu}", cordon_now(answer)
        ),
    )


def _change(
    command: str,
    node_id: str,
    body: object,
    output: Output,
    connection: ConnectionFlags | None,
) -> int:
    return post_change(
        command,
        lambda: f"{ADMIN}/nodes/{segment(node_id, 'the node id')}/{command}",
        NodeChange,
        body,
        output,
        connection,
        done=f"node {node_id}: {command}ed",
        unchanged=_unchanged_cordon(f"node {node_id}:", f"{command}ed"),
    )


def cordon_reason_text(node: NodeView) -> str:
    return node.cordon_reason or "no reason given"


def unlisted_cordon_text(cordon: UnlistedGpuCordonView) -> str:
    """``GPU 5 (not listed by the node): cordoned by alice: ecc errors``."""
    reason = cordon.cordon_reason or "no reason given"
    return (
        f"GPU {cordon.index} (not listed by the node): cordoned by {cordon.cordoned_by}: {reason}"
    )


def gpus_cordoned_text(indexes: list[int]) -> str:
    """``, GPU 3 cordoned`` (``, GPUs 3,5 cordoned``) after a node's state; empty for none."""
    return _gpus_text(indexes, "cordoned")


def gpus_held_elsewhere_text(indexes: list[int]) -> str:
    """``, GPU 0 held elsewhere`` after a node's state: another node, connected longer,
    lists its UUID too (``llmgw-cli node`` names it); empty for none."""
    return _gpus_text(indexes, "held elsewhere")


def _gpus_text(indexes: list[int], what: str) -> str:
    if not indexes:
        return ""
    listed = ",".join(map(str, indexes))
    return f", GPU{'s' if len(indexes) > 1 else ''} {listed} {what}"


def connection_state(connected: bool, lost: bool) -> str:
    return "lost" if lost else "connected" if connected else "disconnected"


def node_state(connected: bool, lost: bool, cordoned: bool, drain_id: str | None) -> str:
    state = connection_state(connected, lost)
    if drain_id is not None:
        return f"{state}, draining ({drain_id})"
    return f"{state}, cordoned" if cordoned else state


def print_node(node: NodeView, wide: bool = False) -> None:
    connection = node.connection
    # The time is the connection's last change: it follows the connection's state, so
    # that it never reads as the time of a cordon (the API gives none).
    state = connection_state(connection.connected, connection.lost)
    if connection.since:
        state += f" since {utc_seconds(connection.since)} UTC"
    if node.cordoned:
        state += ", cordoned"
    state += gpus_cordoned_text([g.index for g in node.gpus if g.cordoned])
    state += gpus_held_elsewhere_text([g.index for g in node.gpus if g.held_elsewhere_by])
    facts: list[tuple[str, str | None]] = [
        ("node", node.id),
        ("state", state),
        ("address", connection.address),
        ("agent", connection.agent_version),
        ("labels", labels_text(node.labels)),
        ("ports", "-".join(str(p) for p in node.port_range)),
    ]
    if not connection.connected and connection.disconnect_reason:
        facts.insert(2, ("disconnected", connection.disconnect_reason))
    if node.cordoned:
        facts.append(("cordoned", cordon_reason_text(node)))
    facts.extend(("GPU cordon", unlisted_cordon_text(c)) for c in node.unlisted_gpu_cordons)
    if node.drain is not None:
        requested = node.drain.requested_at
        at = f" requested {utc_seconds(requested)} UTC" if requested else ""
        facts.append(("draining", f"{node.drain.drain_id}{at}"))
    console = make_console()
    print_facts(facts, console)
    print_table(
        GPU_COLUMNS,
        (
            (
                str(g.index),
                g.uuid,
                g.name,
                f"{g.memory_used_mib}/{g.memory_total_mib}",
                yes_no(g.healthy),
                g.used_by,
                g.excluded_because,
            )
            for g in node.gpus
        ),
        title="GPUs",
        console=console,
        wide=wide,
    )
    if node.replicas:
        print_table(
            (
                Column("replica", key=True),
                Column("model"),
                Column("phase"),
                Column("shards here"),
            ),
            ((r.id, r.model, r.phase, ",".join(str(s) for s in r.shards)) for r in node.replicas),
            title="replicas",
            console=console,
            wide=wide,
        )
