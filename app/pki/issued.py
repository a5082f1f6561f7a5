"""The CA's record of what it issued: one JSON line per certificate, in ``issued.jsonl``.

The CA directory is the only place that knows every certificate it signed (the control
plane sees only the ones that connect), so ``llmgw-cli cert list`` reads this record and
``cert revoke --node`` can say which serials it voids. It holds no secret: serials, names,
dates and where the files went. A line that cannot be read (not JSON, not a whole entry, or
a time without its zone) is skipped and counted, so one damaged line never hides the rest.
The record is read only as a regular file of at most ``MAX_ISSUED_RECORD_BYTES``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated

import msgspec
from cryptography import x509

from app.pki.describe import alternative_names, common_name, kind_of, serial_hex
from app.pki.errors import CertificateFileError
from app.regular_file import FileMissing, FileRefused, read_regular_file

ISSUED_RECORD = "issued.jsonl"
MAX_ISSUED_RECORD_BYTES = 64 * 2**20
"""The largest record read: an entry is a few hundred bytes, so this is some hundred
thousand certificates; a device or a file grown by mistake is refused rather than read."""

ZonedTime = Annotated[datetime, msgspec.Meta(tz=True)]
"""A time with its zone, as every entry is written: one without could not be compared with
the clock or a revocation, and is taken for a damaged line."""


class IssuedCertificate(msgspec.Struct, frozen=True, kw_only=True):
    serial: str
    kind: str
    common_name: str
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    not_before: ZonedTime
    not_after: ZonedTime
    certificate_file: str


class IssuedRecord(msgspec.Struct, frozen=True, kw_only=True):
    certificates: tuple[IssuedCertificate, ...]
    unreadable_lines: int = 0


_decoder = msgspec.json.Decoder(IssuedCertificate)
_encoder = msgspec.json.Encoder()


def record_issued(ca_dir: Path, certificate: x509.Certificate, certificate_file: Path) -> None:
    """Append ``certificate`` to the CA directory's record."""
    dns_names, ip_addresses = alternative_names(certificate)
    entry = IssuedCertificate(
        serial=serial_hex(certificate),
        kind=str(kind_of(certificate)),
        common_name=common_name(certificate),
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        not_before=certificate.not_valid_before_utc,
        not_after=certificate.not_valid_after_utc,
        certificate_file=str(certificate_file.resolve()),
    )
    path = ca_dir / ISSUED_RECORD
    try:
        # O_APPEND: two issuing commands at once each add a whole line.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        with os.fdopen(descriptor, "ab") as handle:
            handle.write(_encoder.encode(entry) + b"\n")
    except OSError as exc:
        raise CertificateFileError(f"cannot record the certificate in {path}: {exc}") from exc


def read_issued(ca_dir: Path) -> IssuedRecord:
    """Every certificate the CA recorded, oldest first (none before it kept a record)."""
    path = ca_dir / ISSUED_RECORD
    try:
        lines = read_regular_file(path, MAX_ISSUED_RECORD_BYTES).splitlines()
    except FileMissing:
        return IssuedRecord(certificates=())
    except FileRefused as exc:
        raise CertificateFileError(f"cannot read {path}: {exc.reason}") from exc
    certificates: list[IssuedCertificate] = []
    unreadable = 0
    for entry in _entries(lines):
        if entry is None:
            unreadable += 1
        else:
            certificates.append(entry)
    return IssuedRecord(certificates=tuple(certificates), unreadable_lines=unreadable)


def _entries(lines: list[bytes]) -> Iterator[IssuedCertificate | None]:
    for line in lines:
        if not line.strip():
            continue
        try:
            yield _decoder.decode(line)
        except msgspec.DecodeError:
            yield None
