"""Revoked certificates: which may still connect, and what revoking one records. Pure.

Two ways to revoke, because an operator knows one of two things:

- the serial of one certificate (``llmgw-cli cert show`` prints it): that certificate is
  refused for good;
- only the node it was issued to (a machine was stolen or rebuilt): every certificate of
  that node issued until the revocation is refused, and one issued afterwards connects. A
  certificate's issue time is its ``not_before`` plus the clock-skew allowance the CA
  backdates it by (``app.pki.model.CLOCK_SKEW``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

import msgspec

from app.domain.events import CertificateRevoked, certificate_stream, node_stream
from app.domain.free_text import reason_errors
from app.domain.model_spec import SpecError
from app.domain.operation_results import Change, InvalidFields
from app.domain.state import CertificateRevocation, ClusterState, revocation_key

NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""The node ids a node certificate can name and the agent hub accepts (``app.pki.names``):
a revocation of any other name would match no certificate that can connect, and would
record a stream no node can have (``..`` in it, a leading ``-``)."""


class PresentedCertificate(msgspec.Struct, frozen=True, kw_only=True):
    """What the TLS layer verified about a node's certificate."""

    common_name: str
    serial: str
    issued_at: datetime | None


class InvalidRevocation(InvalidFields):
    def __init__(self, errors: Sequence[SpecError]) -> None:
        super().__init__("the revocation cannot be recorded", errors)


class RevocationRequest(msgspec.Struct, frozen=True, kw_only=True):
    serial: str | None = None
    node_id: str | None = None
    reason: str


def revocation_refusal(
    revocations: Mapping[str, CertificateRevocation], certificate: PresentedCertificate
) -> str | None:
    """Why ``certificate`` may not connect, or None when it may."""
    by_serial = revocations.get(revocation_key(certificate.serial, None))
    if by_serial is not None:
        return _refusal(by_serial, f"certificate {certificate.serial}")
    by_node = revocations.get(revocation_key(None, certificate.common_name))
    if by_node is None:
        return None
    issued = certificate.issued_at
    if issued is not None and issued > by_node.revoked_at:
        return None  # issued after the node's certificates were revoked: a replacement
    return _refusal(
        by_node, f"the certificates of node {certificate.common_name} issued until then"
    )


def checked(request: RevocationRequest) -> RevocationRequest:
    """``request`` with its serial in llmgw's form; raises ``InvalidRevocation`` naming
    every field that is wrong."""
    errors: list[SpecError] = []
    serial = request.serial
    if serial is not None:
        serial = _normalized_serial(serial, errors)
    if serial is None and not request.node_id and not errors:
        errors.append(SpecError("serial", "name the certificate's serial, or its node_id"))
    if serial is not None and request.node_id:
        errors.append(SpecError("node_id", "name a serial or a node, not both"))
    if request.node_id is not None and not NODE_ID.fullmatch(request.node_id):
        errors.append(
            SpecError(
                "node_id",
                f"{request.node_id[:60]!r} is not a node id: use 1-63 letters, digits, '.', "
                "'_' or '-', starting with a letter or digit",
            )
        )
    reason = request.reason.strip()
    if not reason:
        errors.append(SpecError("reason", "say why the certificate is revoked"))
    else:
        errors.extend(reason_errors("reason", reason))
    if errors:
        raise InvalidRevocation(errors)
    return RevocationRequest(serial=serial, node_id=request.node_id or None, reason=reason)


def revocation_stream(request: RevocationRequest) -> str:
    """The stream a checked request is recorded on."""
    if request.serial is not None:
        return certificate_stream(request.serial)
    assert request.node_id is not None, "a checked request names a serial or a node"
    return node_stream(request.node_id)


def revoke(state: ClusterState, request: RevocationRequest) -> Change:
    """Record a checked request; nothing when a serial is revoked already (a node's
    certificates are revoked again: that voids the ones issued since)."""
    stream = revocation_stream(request)
    if request.serial is not None and revocation_key(request.serial, None) in state.revocations:
        return Change(stream=stream)
    if request.serial is not None:
        _refuse_a_partial_serial(state, request.serial)
    event = CertificateRevoked(
        serial=request.serial, node_id=request.node_id, reason=request.reason
    )
    return Change(stream=stream, events=(event,))


def _refuse_a_partial_serial(state: ClusterState, serial: str) -> None:
    """Refuse ``serial`` when it is only the first digits of the serial a node last
    connected with (and no node's whole serial): copied short, as a hash often is, it would
    record a revocation that matches no certificate and leave the one meant connected."""
    if any(node.certificate_serial == serial for node in state.nodes.values()):
        return
    for node in sorted(state.nodes.values(), key=lambda n: n.id):
        if node.certificate_serial.startswith(serial):
            raise InvalidRevocation(
                [
                    SpecError(
                        "serial",
                        f"{serial!r} is only the start of a serial: node {node.id} last "
                        f"connected with certificate {node.certificate_serial}; give the "
                        "whole serial, as a revocation matches one certificate exactly",
                    )
                ]
            )


def listed(state: ClusterState) -> list[CertificateRevocation]:
    return sorted(state.revocations.values(), key=lambda r: r.revoked_at)


def history_serial(text: str) -> str:
    """A serial to read the history of, in the form its events are recorded under (the
    forms tools print are taken); raises ``InvalidRevocation`` when it is none."""
    errors: list[SpecError] = []
    serial = _normalized_serial(text, errors)
    if serial is None:
        raise InvalidRevocation(errors)
    return serial


def _normalized_serial(text: str, errors: list[SpecError]) -> str | None:
    """A serial as llmgw writes it (lower-case hex, no leading zeros); accepts the forms
    tools print: ``0x`` prefixes and ``:`` separators."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > 40 or any(c not in "0123456789abcdef" for c in digits):
        errors.append(
            SpecError("serial", f"{text[:60]!r} is not a serial (up to 40 hexadecimal digits)")
        )
        return None
    return format(int(digits, 16), "x")


def _refusal(revocation: CertificateRevocation, what: str) -> str:
    # Why first: the refusal reaches the agent as a close frame's reason, 123 bytes at
    # most, and a 40-digit serial and the time ahead of it left a few characters of why.
    return (
        f"revoked: {revocation.reason} (by {revocation.revoked_by} at "
        f"{revocation.revoked_at.isoformat(timespec='seconds')}; {what})"
    )
