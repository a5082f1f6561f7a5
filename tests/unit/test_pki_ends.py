"""When the certificates a server was given end: a CA file holding two CAs (one being
rotated out) gives both, and those ending within the warning's reach come soonest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from app.pki.builders import build_ca
from app.pki.ends import CertificateRole, ending_soon, read_ends
from app.pki.errors import UnreadableFile
from app.pki.keys import generate_key

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_every_ca_of_a_bundle_is_read_with_its_end(tmp_path: Path) -> None:
    old = build_ca(generate_key(), "llmgw CA prod 2025", NOW - timedelta(days=3640), 3650)
    new = build_ca(generate_key(), "llmgw CA prod 2030", NOW, 3650)
    bundle = tmp_path / "ca-bundle.crt"
    bundle.write_bytes(b"".join(ca.certificate.public_bytes(Encoding.PEM) for ca in (old, new)))

    ends = read_ends(CertificateRole.CA, bundle)

    assert [end.subject for end in ends] == [
        "O=llmgw,CN=llmgw CA prod 2025",
        "O=llmgw,CN=llmgw CA prod 2030",
    ]
    assert [end.role for end in ends] == [CertificateRole.CA, CertificateRole.CA]
    assert [end.subject for end in ending_soon(ends, NOW)] == ["O=llmgw,CN=llmgw CA prod 2025"]
    assert ending_soon(ends, NOW, within=timedelta(days=1)) == []


def test_a_file_without_a_certificate_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "ca.crt"
    path.write_text("not a certificate\n")

    with pytest.raises(UnreadableFile, match="no PEM certificate"):
        read_ends(CertificateRole.CA, path)
