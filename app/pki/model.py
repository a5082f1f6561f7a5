"""The CA's vocabulary: what a certificate is for, and the CA itself."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from app.pki.errors import InvalidRequest
from app.pki.keys import PrivateKey

CLOCK_SKEW = timedelta(minutes=5)
"""How far back not_before is set, so that a peer whose clock runs a little behind accepts it."""

ORGANIZATION = "llmgw"
MAX_DAYS = 10_000
"""The longest validity of any certificate, the CA's included: about 27 years."""


class CertificateKind(StrEnum):
    CA = "ca"
    SERVER = "server"
    NODE = "node"
    OPERATOR = "operator"
    UNKNOWN = "unknown"


class Usage(StrEnum):
    """Extended key usages a certificate can be issued with."""

    SERVER_AUTH = "serverAuth"
    CLIENT_AUTH = "clientAuth"

    @property
    def oid(self) -> x509.ObjectIdentifier:
        match self:
            case Usage.SERVER_AUTH:
                return ExtendedKeyUsageOID.SERVER_AUTH
            case Usage.CLIENT_AUTH:
                return ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True)
class CertificateAuthority:
    certificate: x509.Certificate
    key: PrivateKey


@dataclass(frozen=True)
class Validity:
    not_before: datetime
    not_after: datetime

    @classmethod
    def starting(cls, now: datetime, days: int) -> Validity:
        """Valid from `now` (less the clock skew allowance) for `days` days."""
        require_aware(now)
        if not 1 <= days <= MAX_DAYS:
            raise InvalidRequest(
                f"validity must be at least 1 day and at most {MAX_DAYS} days (about 27 "
                f"years), not {days}"
            )
        return cls(not_before=now - CLOCK_SKEW, not_after=now + timedelta(days=days))

    @classmethod
    def within(cls, ca: CertificateAuthority, now: datetime, days: int) -> Validity:
        """Like ``starting``, for a certificate ``ca`` issues: refused when it would
        outlive the CA, which stops vouching for it then."""
        validity = cls.starting(now, days)
        ca_expires = ca.certificate.not_valid_after_utc
        # Certificates keep whole seconds: a leaf issued for as long as the CA from the same
        # moment ends with it.
        if validity.not_after.replace(microsecond=0) > ca_expires:
            left = (ca_expires - now).days
            # A day is the shortest certificate: with less left, there is no --days to advise.
            possible = (
                f"issue it for at most {_days(left)}, or"
                if left >= 1
                else "it expires in less than a day, too soon for any certificate;"
            )
            # Never `init-ca --force` here: replacing the CA in place would leave every
            # certificate it issued untrusted at once; a rotation keeps both for a while.
            raise InvalidRequest(
                f"a certificate valid for {_days(days)} would outlive the CA, which expires on "
                f"{ca_expires:%Y-%m-%d %H:%M} UTC: {possible} rotate the CA: create a new one "
                "in a new directory (`llmgw-cli cert init-ca --dir NEW_DIR`) and issue from "
                "it, as docs/certificates.md (Rotation) says"
            )
        return validity


def _days(count: int) -> str:
    return f"{count} day" if count == 1 else f"{count} days"


def require_aware(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidRequest(f"{moment.isoformat()} has no time zone; pass an aware datetime")
    return moment
