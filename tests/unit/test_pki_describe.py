"""describe(): what a certificate says, in words, and what llmgw would use it as."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from cryptography.hazmat.primitives import hashes

from app.pki.builders import build_ca, issue, issue_node, issue_operator, issue_server
from app.pki.describe import describe, kind_of
from app.pki.keys import generate_key
from app.pki.model import CertificateAuthority, CertificateKind, Usage, Validity

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return build_ca(generate_key(), "llmgw CA", NOW, 3650)


def test_a_node_certificate_is_described_in_words(ca: CertificateAuthority) -> None:
    certificate = issue_node(ca, generate_key(), "gpu-07", NOW, 365)

    description = describe(certificate, NOW)

    assert description.kind is CertificateKind.NODE
    assert description.common_name == "gpu-07"
    assert description.organizational_unit == "node"
    assert description.subject == "O=llmgw,OU=node,CN=gpu-07"
    assert description.issuer == "O=llmgw,CN=llmgw CA"
    assert not description.self_signed
    assert not description.is_ca
    assert description.key_usages == ("digital signature",)
    assert description.extended_key_usages == ("client authentication",)
    assert description.dns_names == ()
    assert description.ip_addresses == ()
    assert description.public_key == "ECDSA P-256"
    assert description.not_before == NOW - timedelta(minutes=5)
    assert description.not_after == NOW + timedelta(days=365)
    assert description.serial == format(certificate.serial_number, "x")
    fingerprint = certificate.fingerprint(hashes.SHA256())
    assert description.sha256_fingerprint == fingerprint.hex(":").upper()


def test_a_server_certificate_lists_its_sans(ca: CertificateAuthority) -> None:
    certificate = issue_server(
        ca, generate_key(), ["llmgw.internal"], [ipaddress.ip_address("127.0.0.5")], NOW, 825
    )

    description = describe(certificate, NOW)

    assert description.kind is CertificateKind.SERVER
    assert description.dns_names == ("llmgw.internal",)
    assert description.ip_addresses == ("127.0.0.5",)
    assert description.extended_key_usages == ("server authentication",)


def test_the_ca_is_described_as_a_self_signed_ca(ca: CertificateAuthority) -> None:
    description = describe(ca.certificate, NOW)

    assert description.kind is CertificateKind.CA
    assert description.is_ca
    assert description.self_signed
    assert description.key_usages == (
        "digital signature",
        "certificate signing",
        "CRL signing",
    )
    assert description.extended_key_usages == ()


def test_expiry_is_judged_at_the_given_time(ca: CertificateAuthority) -> None:
    certificate = issue_operator(ca, generate_key(), "alice", NOW, 30)

    assert not describe(certificate, NOW + timedelta(days=29)).expired
    assert describe(certificate, NOW + timedelta(days=31)).expired
    assert describe(certificate, NOW - timedelta(hours=1)).not_yet_valid
    assert not describe(certificate, NOW - timedelta(minutes=1)).not_yet_valid


def test_a_node_unit_without_client_auth_is_of_unknown_kind(ca: CertificateAuthority) -> None:
    certificate = issue(
        ca,
        generate_key(),
        common_name="gpu-07",
        unit="node",
        usages=(Usage.SERVER_AUTH,),
        validity=Validity.starting(NOW, 1),
    )

    assert kind_of(certificate) is CertificateKind.UNKNOWN


def test_the_description_encodes_to_json_with_kind_in_words(ca: CertificateAuthority) -> None:
    description = describe(issue_operator(ca, generate_key(), "alice", NOW, 30), NOW)

    decoded = msgspec.json.decode(msgspec.json.encode(description))

    assert decoded["kind"] == "operator"
    assert decoded["not_after"] == "2030-01-31T12:00:00Z"
    assert decoded["extended_key_usages"] == ["client authentication"]
