"""What `llmgw-cli cert list` warns of before it lists: a CA that ends within
``WARN_WITHIN`` (every certificate it issued ends by then, and it can issue none past it),
and the certificates in use that do.

Only the latest certificate of each kind and name counts: one that a replacement has
superseded needs nothing done, and the warning would otherwise stay for ever.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from app.pki.ends import WARN_WITHIN
from app.pki.issued import IssuedCertificate

ROTATION = "docs/certificates.md, Rotation"


def ca_warning(ca_dir: Path, ca_not_after: datetime, now: datetime) -> str | None:
    """A line when the CA in ``ca_dir`` has ended or ends within ``WARN_WITHIN``."""
    when = f"{ca_not_after:%Y-%m-%d %H:%M} UTC"
    if ca_not_after <= now:
        return (
            f"the CA in {ca_dir} expired on {when}: nothing it issued is accepted any more; "
            f"create a new one in a new directory and issue from it ({ROTATION})"
        )
    if ca_not_after < now + WARN_WITHIN:
        days = (ca_not_after - now).days
        return (
            f"the CA in {ca_dir} expires on {when} (in {days} days): every certificate it "
            f"issued ends by then; rotate it now, while both CAs can be trusted ({ROTATION})"
        )
    return None


def leaf_warning(
    issued: Iterable[IssuedCertificate], revoked: set[str], now: datetime
) -> str | None:
    """A line when the latest certificate of some kind and name, not revoked (``revoked``:
    serials), has ended or ends within ``WARN_WITHIN``, naming the soonest."""
    latest: dict[tuple[str, str], IssuedCertificate] = {}
    for certificate in issued:
        key = (certificate.kind, certificate.common_name)
        held = latest.get(key)
        if held is None or certificate.not_before >= held.not_before:
            latest[key] = certificate
    ending = sorted(
        (
            certificate
            for certificate in latest.values()
            if certificate.serial not in revoked and certificate.not_after < now + WARN_WITHIN
        ),
        key=_not_after,
    )
    if not ending:
        return None
    soonest = ending[0]
    verb = "ended" if soonest.not_after <= now else "ends"
    return (
        f"{len(ending)} current certificate(s) (the latest issued for each name) end within "
        f"{WARN_WITHIN.days} days or have ended; the soonest, {soonest.kind} "
        f"{soonest.common_name}, {verb} on {soonest.not_after:%Y-%m-%d %H:%M} UTC: issue "
        f"replacements with the same command and --force, and restart what uses them "
        f"({ROTATION})"
    )


def _not_after(certificate: IssuedCertificate) -> datetime:
    return certificate.not_after
