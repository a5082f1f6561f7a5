"""``/admin/v1/certificates``: revoke node certificates, and what the log knows of them.

The CA's key stays on the operator's machine (``llmgw-cli cert``); what the control plane
knows is which certificate each node last connected with and what was revoked. A
revocation is an event: the leader's agent hub refuses the certificate at the handshake
from then on and closes the live connections that use it within a second.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.status_codes import HTTP_201_CREATED

from app.admin.guarded import GuardedController
from app.admin.schemas import as_view
from app.domain.revocations import RevocationRequest
from app.domain.state import CertificateRevocation
from app.services.operations import Caller, Operations


class RevocationBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    serial: str | None = None
    """The certificate's serial, in hex as ``llmgw-cli cert show`` prints it."""
    node_id: str | None = None
    """Instead of a serial: every certificate issued to this node until now."""
    reason: str


class RevocationView(msgspec.Struct, frozen=True, kw_only=True):
    serial: str | None
    node_id: str | None
    reason: str
    revoked_at: datetime
    revoked_by: str


class RevocationChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when that serial was revoked already (nothing was recorded)."""
    revocation: RevocationView


class NodeCertificateView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    serial: str
    """The certificate the node's agent last connected with ("" before any was recorded)."""
    connected: bool


class CertificatesView(msgspec.Struct, frozen=True, kw_only=True):
    revocations: list[RevocationView]
    nodes: list[NodeCertificateView]


def revocation_view(revocation: CertificateRevocation) -> RevocationView:
    return as_view(revocation, RevocationView)


class CertificateController(GuardedController):
    path = "/admin/v1/certificates"
    tags = ["certificates"]

    @get("/", summary="Revoked certificates, and the certificate each node last used")
    async def certificates(self, operations: NamedDependency[Operations]) -> CertificatesView:
        state = await operations.current()
        return CertificatesView(
            revocations=[revocation_view(r) for r in await operations.list_revocations()],
            nodes=[
                NodeCertificateView(
                    node_id=node.id, serial=node.certificate_serial, connected=node.connected
                )
                for node in sorted(state.nodes.values(), key=lambda n: n.id)
            ],
        )

    @post(
        "/revocations",
        status_code=HTTP_201_CREATED,
        summary="Revoke a certificate by its serial, or every certificate of a node",
        description="With `serial`, that certificate may never connect again; with "
        "`node_id` alone, every certificate issued to the node until now (one issued "
        "afterwards connects). The agent hub closes live connections that use one within a "
        "second. Revoking a serial again records nothing (`changed` false).",
    )
    async def revoke(
        self,
        data: JSONBody[RevocationBody],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
    ) -> RevocationChange:
        request = RevocationRequest(serial=data.serial, node_id=data.node_id, reason=data.reason)
        changed, revocation = await operations.revoke_certificate(caller, request)
        return RevocationChange(changed=changed, revocation=revocation_view(revocation))
