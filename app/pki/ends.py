"""When the certificates a server presents and trusts end, so that an end is seen weeks
ahead rather than on the day.

TLS checks a certificate's dates at each handshake only: a server whose own certificate
(or CA) has ended keeps the agents connected before, and every agent that dials it after,
at its next restart or failover, refuses it and exits, the whole fleet at once. So
``serve`` reads the ends of what it was given when it starts, warns of those within
``WARN_WITHIN`` (``certificate_expires_soon``; ``certificate_expired`` for one already
past) and publishes them on ``/metrics`` for an alert to watch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

from cryptography import x509

from app.pki.describe import serial_hex
from app.pki.errors import UnreadableFile
from app.pki.limits import MAX_PEM_FILE_BYTES
from app.regular_file import FileRefused, read_regular_file

WARN_WITHIN = timedelta(days=30)


class CertificateRole(StrEnum):
    """What a server does with a certificate it was given."""

    AGENT_HUB = "agent_hub"
    """``--tls-cert``: presented to agents."""
    ADMIN = "admin"
    """``--admin-tls-cert``: presented to operators."""
    CA = "ca"
    """In ``--tls-ca`` (several while a CA is rotated) or ``--admin-ca``: trusted."""


@dataclass(frozen=True)
class CertificateEnd:
    role: CertificateRole
    serial: str
    """In lower-case hex, as ``llmgw-cli cert show`` and ``cert list`` print it."""
    subject: str
    not_after: datetime


def read_ends(role: CertificateRole, path: Path) -> list[CertificateEnd]:
    """Every certificate in the PEM file ``path`` (a CA file may hold several), with its end;
    raises ``UnreadableFile``."""
    try:
        data = read_regular_file(path, MAX_PEM_FILE_BYTES, holder="a certificate file")
    except FileRefused as exc:
        raise UnreadableFile(path, exc.reason) from exc
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise UnreadableFile(path, f"no PEM certificate in it: {exc}") from exc
    return [
        CertificateEnd(
            role=role,
            serial=serial_hex(certificate),
            subject=certificate.subject.rfc4514_string(),
            not_after=certificate.not_valid_after_utc,
        )
        for certificate in certificates
    ]


def unique_ends(ends: Iterable[CertificateEnd]) -> tuple[CertificateEnd, ...]:
    """``ends`` without repeats (one CA given for agents and operators both), in order."""
    return tuple(dict.fromkeys(ends))


def ending_soon(
    ends: Sequence[CertificateEnd], now: datetime, within: timedelta = WARN_WITHIN
) -> list[CertificateEnd]:
    """Those of ``ends`` that end before ``now + within``, the soonest first."""
    return sorted((end for end in ends if end.not_after < now + within), key=_not_after)


def _not_after(end: CertificateEnd) -> datetime:
    return end.not_after
