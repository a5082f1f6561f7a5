"""What an agent the control plane refused should do, as commands to run: the agent knows
its own node id and the address it advertises, so the advice names them rather than
leaving placeholders for the operator to fill in.

A new certificate is issued where the llmgw CA is kept, never on a server
(docs/certificates.md: ``ca.key`` is never copied to a server or a node).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime

from app.pki.names import address_flag


@dataclass(frozen=True)
class NodeClaim:
    """Who the agent says it is: its node id, the address it advertises for its engines
    (``None``: the address its connection comes from), and its certificate's validity
    (``not_before``, ``not_after``), where it could be read."""

    node_id: str
    address: str | None = None
    certificate_validity: tuple[datetime, datetime] | None = None

    def issue_command(self, *, naming_address: bool = False) -> str:
        """``llmgw-cli cert node ID``, naming the advertised address when asked to."""
        words = ["llmgw-cli", "cert", "node", self.node_id]
        if naming_address and self.address is not None:
            words += [address_flag(self.address), self.address]
        return shlex.join(words)


def node_certificate_hint(node: NodeClaim) -> str:
    return (
        "issue a node certificate for this node id where the llmgw CA is kept "
        f"(`{node.issue_command()}`, on the operator's machine: never on a server), copy it "
        "here, and check the files with `llmgw-cli cert show`"
    )


def certificate_dates_note(node: NodeClaim, now: datetime) -> str:
    """What this machine's clock says of the node certificate's dates, when they explain a
    refusal (expired, or not valid yet); empty when they are in order or unknown. The
    server judges by its own clock, which may differ."""
    if node.certificate_validity is None:
        return ""
    not_before, not_after = node.certificate_validity
    if now >= not_after:
        return f"this node's certificate expired on {not_after:%Y-%m-%d %H:%M:%S} UTC. "
    if now < not_before:
        return (
            f"this node's certificate is not valid until {not_before:%Y-%m-%d %H:%M:%S} UTC "
            "by this machine's clock: check the clocks of this machine, of the control plane "
            "and of the machine that issued it. "
        )
    return ""


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
