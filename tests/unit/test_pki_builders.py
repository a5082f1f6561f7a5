"""Building the CA and its certificates: every field a TLS peer or llmgw relies on."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from app.pki.builders import build_ca, issue, issue_node, issue_operator, issue_server
from app.pki.errors import InvalidRequest
from app.pki.keys import PrivateKey, generate_key
from app.pki.model import CertificateAuthority, Usage, Validity

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SKEW = timedelta(minutes=5)
IP = ipaddress.ip_address
Ext = TypeVar("Ext", bound=x509.ExtensionType)
IssueClientCertificate = Callable[
    [CertificateAuthority, PrivateKey, str, datetime, int], x509.Certificate
]


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return build_ca(generate_key(), "llmgw CA", NOW, 3650)


def extension(certificate: x509.Certificate, kind: type[Ext]) -> x509.Extension[Ext]:
    return certificate.extensions.get_extension_for_class(kind)


def attribute(certificate: x509.Certificate, oid: x509.ObjectIdentifier) -> str:
    return str(certificate.subject.get_attributes_for_oid(oid)[0].value)


def verify_as_server(ca: CertificateAuthority, leaf: x509.Certificate, dialled: str) -> None:
    try:
        name: x509.DNSName | x509.IPAddress = x509.IPAddress(IP(dialled))
    except ValueError:
        name = x509.DNSName(dialled)
    verifier = PolicyBuilder().store(Store([ca.certificate])).time(NOW).build_server_verifier(name)
    verifier.verify(leaf, [])


def test_the_ca_is_a_self_signed_root_that_signs_only_leaves(ca: CertificateAuthority) -> None:
    certificate = ca.certificate
    certificate.verify_directly_issued_by(certificate)
    assert attribute(certificate, NameOID.COMMON_NAME) == "llmgw CA"
    assert certificate.issuer == certificate.subject

    constraints = extension(certificate, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0

    usage = extension(certificate, x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign

    key_id = extension(certificate, x509.SubjectKeyIdentifier).value.digest
    assert extension(certificate, x509.AuthorityKeyIdentifier).value.key_identifier == key_id

    assert certificate.not_valid_before_utc == NOW - SKEW
    assert certificate.not_valid_after_utc == NOW + timedelta(days=3650)


def test_a_server_certificate_names_every_host_and_ip_as_sans(ca: CertificateAuthority) -> None:
    certificate = issue_server(
        ca,
        generate_key(),
        hosts=["llmgw.internal", "localhost"],
        ips=[IP("127.0.0.5"), IP("::1")],
        now=NOW,
        days=825,
    )

    sans = extension(certificate, x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["llmgw.internal", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [IP("127.0.0.5"), IP("::1")]
    assert attribute(certificate, NameOID.COMMON_NAME) == "llmgw.internal"
    assert attribute(certificate, NameOID.ORGANIZATIONAL_UNIT_NAME) == "server"
    assert list(extension(certificate, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert certificate.not_valid_before_utc == NOW - SKEW
    assert certificate.not_valid_after_utc == NOW + timedelta(days=825)
    for dialled in ("llmgw.internal", "localhost", "127.0.0.5", "::1"):
        verify_as_server(ca, certificate, dialled)


def test_a_server_certificate_does_not_verify_for_an_address_it_does_not_name(
    ca: CertificateAuthority,
) -> None:
    certificate = issue_server(ca, generate_key(), [], [IP("127.0.0.2")], NOW, 30)

    assert attribute(certificate, NameOID.COMMON_NAME) == "127.0.0.2"
    with pytest.raises(VerificationError, match="subjectAltName"):
        verify_as_server(ca, certificate, "127.0.0.1")


@pytest.mark.parametrize(
    ("build", "name", "unit"),
    [(issue_node, "gpu-07", "node"), (issue_operator, "alice", "operator")],
)
def test_client_certificates_carry_their_name_unit_and_client_auth_only(
    ca: CertificateAuthority, build: IssueClientCertificate, name: str, unit: str
) -> None:
    certificate = build(ca, generate_key(), name, NOW, 365)

    certificate.verify_directly_issued_by(ca.certificate)
    assert attribute(certificate, NameOID.COMMON_NAME) == name
    assert attribute(certificate, NameOID.ORGANIZATIONAL_UNIT_NAME) == unit
    assert certificate.issuer == ca.certificate.subject
    assert list(extension(certificate, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert certificate.not_valid_before_utc == NOW - SKEW
    assert certificate.not_valid_after_utc == NOW + timedelta(days=365)


def test_leaves_are_not_cas_sign_only_and_point_at_their_issuer(
    ca: CertificateAuthority,
) -> None:
    key = generate_key()
    certificate = issue_node(ca, key, "gpu-07", NOW, 365)

    constraints = extension(certificate, x509.BasicConstraints)
    assert constraints.critical
    assert not constraints.value.ca
    usage = extension(certificate, x509.KeyUsage)
    assert usage.critical
    assert usage.value.digital_signature
    assert not usage.value.key_cert_sign
    assert extension(certificate, x509.SubjectKeyIdentifier).value == (
        x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    )
    ca_key_id = extension(ca.certificate, x509.SubjectKeyIdentifier).value.digest
    assert extension(certificate, x509.AuthorityKeyIdentifier).value.key_identifier == ca_key_id
    assert certificate.public_key() == key.public_key()


def test_serials_are_random(ca: CertificateAuthority) -> None:
    key = generate_key()
    serials = {issue_node(ca, key, "gpu-07", NOW, 1).serial_number for _ in range(5)}
    assert len(serials) == 5


def test_the_low_level_issue_builds_expired_and_non_client_certificates_on_request(
    ca: CertificateAuthority,
) -> None:
    validity = Validity(not_before=NOW - timedelta(days=10), not_after=NOW - timedelta(days=1))

    certificate = issue(
        ca,
        generate_key().public_key(),
        common_name="gpu-07",
        unit="node",
        usages=(Usage.SERVER_AUTH,),
        validity=validity,
        serial=42,
    )

    assert certificate.serial_number == 42
    assert certificate.not_valid_after_utc == NOW - timedelta(days=1)
    assert list(extension(certificate, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]


def test_the_low_level_issue_leaves_out_usages_when_given_none(ca: CertificateAuthority) -> None:
    certificate = issue(
        ca,
        generate_key(),
        common_name="anything",
        unit=None,
        usages=(),
        validity=Validity.starting(NOW, 1),
    )

    with pytest.raises(x509.ExtensionNotFound):
        extension(certificate, x509.ExtendedKeyUsage)
    assert certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME) == []


@pytest.mark.parametrize(
    "node_id", ["", "a" * 64, "gpu 7", "gpu/7", "../etc", "gpü", ".", "..", "-x", ".gpu"], ids=repr
)
def test_node_ids_outside_the_allowed_characters_are_refused(
    ca: CertificateAuthority, node_id: str
) -> None:
    with pytest.raises(InvalidRequest, match="invalid node id"):
        issue_node(ca, generate_key(), node_id, NOW, 365)


def test_names_with_dots_underscores_and_dashes_up_to_63_characters_are_accepted(
    ca: CertificateAuthority,
) -> None:
    name = "rack-1.gpu_07" + "x" * 50
    assert len(name) == 63
    issue_operator(ca, generate_key(), name, NOW, 1)


def test_an_ip_passed_as_a_host_is_refused_with_a_pointer_to_ip(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidRequest, match="pass it with --ip"):
        issue_server(ca, generate_key(), ["127.0.0.5"], [], NOW, 825)


@pytest.mark.parametrize("host", ["-bad.example", "bad_host", "a..b", "x" * 64 + ".com"])
def test_malformed_host_names_are_refused(ca: CertificateAuthority, host: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid host name"):
        issue_server(ca, generate_key(), [host], [], NOW, 825)


def test_a_server_certificate_needs_at_least_one_name(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidRequest, match="at least one host name or IP"):
        issue_server(ca, generate_key(), [], [], NOW, 825)


def test_validity_needs_an_aware_clock_and_at_least_one_day(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidRequest, match="no time zone"):
        issue_node(ca, generate_key(), "gpu-07", datetime(2030, 1, 1), 365)
    with pytest.raises(InvalidRequest, match="at least 1 day"):
        issue_node(ca, generate_key(), "gpu-07", NOW, 0)


def test_keys_other_than_p256_are_refused(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidRequest, match="P-256"):
        issue_node(ca, ec.generate_private_key(ec.SECP384R1()), "gpu-07", NOW, 365)


@pytest.mark.parametrize("issue_client", [issue_node, issue_operator])
def test_a_certificate_may_not_outlive_the_ca_that_issues_it(
    issue_client: IssueClientCertificate,
) -> None:
    short_lived = build_ca(generate_key(), "llmgw CA", NOW, 30)

    with pytest.raises(InvalidRequest, match="would outlive the CA") as refused:
        issue_client(short_lived, generate_key(), "gpu-07", NOW, 31)
    with pytest.raises(InvalidRequest, match="would outlive the CA"):
        issue_server(short_lived, generate_key(), ["llmgw.internal"], [], NOW, 31)

    assert "issue it for at most 30 days" in str(refused.value)
    last_day = issue_client(short_lived, generate_key(), "gpu-07", NOW, 30)
    assert last_day.not_valid_after_utc == short_lived.certificate.not_valid_after_utc


def test_a_ca_in_its_last_day_says_it_can_issue_nothing_more() -> None:
    """Before, it said to issue "for at most 0 days", which --days refuses: no advice at
    all. A CA made with --days 1 is in its last day from the start."""
    one_day = build_ca(generate_key(), "llmgw CA", NOW, 1)

    with pytest.raises(InvalidRequest) as refused:
        issue_node(one_day, generate_key(), "gpu-07", NOW + timedelta(seconds=1), 1)

    assert "at most 0 days" not in str(refused.value)
    assert "expires in less than a day, too soon for any certificate" in str(refused.value)
    assert "llmgw-cli cert init-ca" in str(refused.value)
    assert "a certificate valid for 1 day would outlive the CA" in str(refused.value)


def test_the_advice_for_a_ca_near_its_end_is_a_rotation_never_overwriting_it() -> None:
    """`init-ca --force` on the CA directory replaces the CA in place, and every
    certificate it issued stops being trusted at once; docs/certificates.md rotates it."""
    two_days = build_ca(generate_key(), "llmgw CA", NOW, 2)

    with pytest.raises(InvalidRequest) as refused:
        issue_node(two_days, generate_key(), "gpu-07", NOW + timedelta(hours=1), 2)

    assert "issue it for at most 1 day, or rotate the CA" in str(refused.value)
    assert "--force" not in str(refused.value)
    assert "in a new directory (`llmgw-cli cert init-ca --dir NEW_DIR`)" in str(refused.value)


@pytest.mark.parametrize("days", [10_001, 3_650_000, 10**12])
def test_validity_beyond_the_longest_is_refused_not_an_overflow(days: int) -> None:
    with pytest.raises(InvalidRequest, match="at most 10000 days"):
        build_ca(generate_key(), "llmgw CA", NOW, days)
