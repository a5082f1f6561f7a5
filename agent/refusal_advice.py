"""What an agent the control plane refused should do, as commands to run: the agent knows
its own node id and the address it advertises, so the advice names them rather than
leaving placeholders for the operator to fill in.

A new certificate is issued where the llmgw CA is kept, never on a server
(docs/certificates.md: ``ca.key`` is never copied to a server or a node).
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeClaim:
    """Who the agent says it is: its node id, and the address it advertises for its engines
    (``None``: the address its connection comes from)."""

    node_id: str
    address: str | None = None

    def issue_command(self, *, naming_address: bool = False) -> str:
        """``llmgw-cli cert node ID``, naming the advertised address when asked to."""
        words = ["llmgw-cli", "cert", "node", self.node_id]
        if naming_address and self.address is not None:
            words += [_address_flag(self.address), self.address]
        return shlex.join(words)


def node_certificate_hint(node: NodeClaim) -> str:
    return (
        "issue a node certificate for this node id where the llmgw CA is kept "
        f"(`{node.issue_command()}`, on the operator's machine: never on a server), copy it "
        "here, and check the files with `llmgw-cli cert show`"
    )


def refusal_advice(reason: str, node: NodeClaim) -> str:
    """What fixes the refusal the server named, when the reason says which it was."""
    if "common name" in reason or "certificate of kind" in reason:
        return (
            f". The certificate's common name must equal --node-id: {node_certificate_hint(node)}"
        )
    if "outside the engine networks" in reason:
        return (
            ". Set --address to an address of this node inside the engine networks the reason "
            "names, or have the control plane's --engine-networks include the address"
        )
    if "advertised address" in reason:
        return (
            ". Set --address to the address this agent connects from, or reissue the node "
            "certificate naming the address where the llmgw CA is kept: "
            f"`{node.issue_command(naming_address=True)}`"
        )
    if "revoked" in reason or "certificate expired" in reason:
        return f". This node needs a new certificate: {node_certificate_hint(node)}"
    return ""


def _address_flag(address: str) -> str:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return "--host"
    return "--ip"
