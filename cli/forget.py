"""`llmgw-cli forget <node> --reason TEXT [--revoke-certificates]`: a retired machine gone
for good. Beside `cordon` and `drain`, the last step of a node's life: the control plane
forgets it (it leaves `nodes`, placement and `explain-placement`), the log keeps its
history."""

from __future__ import annotations

from typing import Annotated

import msgspec
from cyclopts import Parameter

from cli.arguments import MAX_REASON_LENGTH, segment, stripped_one_line_reason
from cli.client import ADMIN
from cli.config import ConnectionFlags
from cli.nodes import NodeId
from cli.operator import Output, post_change
from cli.render import EXIT_USAGE, print_error


class NodeForgetting(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str = ""
    changed: bool = True
    certificates_revoked: bool = False


def forget(
    node_id: NodeId,
    /,
    *,
    reason: Annotated[
        str,
        Parameter(
            converter=stripped_one_line_reason,
            help="Why the node is gone for good, for whoever reads its history: one line of "
            f"at most {MAX_REASON_LENGTH} characters.",
        ),
    ],
    revoke_certificates: Annotated[
        bool,
        Parameter(
            negative=(),
            help="Also revoke every certificate issued to the node until now (as `llmgw-cli "
            "cert revoke --node` does), so that its agent cannot come back under its id.",
        ),
    ] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Forget a retired node for good: `nodes` no longer lists it and placement no longer
    weighs it; its history, and that of the replicas that ran on it, stay. Refused while
    its agent is connected, while a replica not ended has a shard on it, or while a drain
    of it is under way: drain it, stop its agent with `--engines-on-exit stop`, then forget
    it. An agent that connects under its id later, with a certificate still valid, is
    registered anew as a node never seen: --revoke-certificates keeps it out.

    ```
    llmgw-cli forget gpu-08 --reason "returned to the cloud"
    llmgw-cli forget gpu-08 --reason "rebuilt as gpu-31" --revoke-certificates
    ```
    """
    if not reason:
        print_error("forget", "--reason must say why the node is forgotten")
        return EXIT_USAGE
    revoked = " and its certificates revoked" if revoke_certificates else ""
    return post_change(
        "forget",
        lambda: f"{ADMIN}/nodes/{segment(node_id, 'the node id')}/forget",
        NodeForgetting,
        {"reason": reason, "revoke_certificates": revoke_certificates},
        output,
        connection,
        done=f"node {node_id}: forgotten{revoked}",
        unchanged=f"node {node_id}: forgotten{revoked}",
    )
