"""peer_identity() and the TLS contexts, without a connection (the handshakes are in
tests/integration/test_tls_handshake.py)."""

from __future__ import annotations

import os
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.pki.builders import build_ca, issue, issue_node, issue_operator, issue_server
from app.pki.errors import CertificateRejected, TlsConfigurationError
from app.pki.files import write_ca, write_issued
from app.pki.keys import generate_key
from app.pki.model import CertificateAuthority, CertificateKind, Usage, Validity
from app.pki.tls import client_ssl_context, peer_identity, server_ssl_context

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return build_ca(generate_key(), "llmgw CA", NOW, 3650)


def node_certificate(ca: CertificateAuthority, node_id: str = "gpu-07") -> x509.Certificate:
    return issue_node(ca, generate_key(), node_id, NOW, 365)


def test_a_node_certificate_identifies_the_node(ca: CertificateAuthority) -> None:
    der = node_certificate(ca).public_bytes(Encoding.DER)

    identity = peer_identity(der, expect=CertificateKind.NODE)

    assert identity.common_name == "gpu-07"
    assert identity.kind is CertificateKind.NODE
    assert identity.subject == "O=llmgw,OU=node,CN=gpu-07"


def test_the_hub_refuses_an_operator_certificate(ca: CertificateAuthority) -> None:
    operator = issue_operator(ca, generate_key(), "alice", NOW, 365)

    assert peer_identity(operator).kind is CertificateKind.OPERATOR
    with pytest.raises(CertificateRejected, match="only node certificates are accepted") as refused:
        peer_identity(operator, expect=CertificateKind.NODE)
    assert str(refused.value) == (
        "certificate 'O=llmgw,OU=operator,CN=alice' is an operator certificate; only node "
        "certificates are accepted here"
    )


def test_the_admin_api_refuses_a_node_certificate(ca: CertificateAuthority) -> None:
    with pytest.raises(CertificateRejected, match="only operator certificates are accepted"):
        peer_identity(node_certificate(ca), expect=CertificateKind.OPERATOR)


def test_a_certificate_without_client_auth_is_refused(ca: CertificateAuthority) -> None:
    server_only = issue(
        ca,
        generate_key(),
        common_name="gpu-07",
        unit="node",
        usages=(Usage.SERVER_AUTH,),
        validity=Validity.starting(NOW, 1),
    )

    with pytest.raises(CertificateRejected, match="not issued for client authentication"):
        peer_identity(server_only)


def test_server_and_ca_certificates_are_not_client_identities(ca: CertificateAuthority) -> None:
    server = issue_server(ca, generate_key(), ["llmgw.internal"], [], NOW, 1)
    both = issue(
        ca,
        generate_key(),
        common_name="llmgw.internal",
        unit="server",
        usages=(Usage.SERVER_AUTH, Usage.CLIENT_AUTH),
        validity=Validity.starting(NOW, 1),
    )

    with pytest.raises(CertificateRejected, match="clientAuth"):
        peer_identity(server)
    with pytest.raises(CertificateRejected, match="not a node or operator certificate"):
        peer_identity(both)
    with pytest.raises(CertificateRejected):
        peer_identity(ca.certificate)


def test_no_certificate_at_all_is_refused() -> None:
    with pytest.raises(CertificateRejected, match="presented no certificate"):
        peer_identity(b"")


@pytest.fixture
def files(tmp_path: Path, ca: CertificateAuthority) -> Path:
    write_ca(tmp_path, ca, force=False)
    key = generate_key()
    server = issue_server(ca, key, ["localhost"], [], datetime.now(UTC), 1)
    write_issued(tmp_path, "server", server, key, force=False)
    return tmp_path


def test_the_server_context_requires_verified_client_certificates(files: Path) -> None:
    context = server_ssl_context(files / "server.crt", files / "server.key", files / "ca.crt")

    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_the_server_context_can_leave_client_certificates_optional(files: Path) -> None:
    context = server_ssl_context(
        files / "server.crt", files / "server.key", files / "ca.crt", require_client_cert=False
    )

    assert context.verify_mode == ssl.CERT_OPTIONAL


def test_the_client_context_checks_the_host_against_sans_only(files: Path) -> None:
    context = client_ssl_context(files / "ca.crt")

    assert context.check_hostname
    assert not context.hostname_checks_common_name
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_files_that_cannot_be_loaded_name_the_file(files: Path) -> None:
    with pytest.raises(TlsConfigurationError, match=r"missing\.crt"):
        client_ssl_context(files / "missing.crt")
    with pytest.raises(TlsConfigurationError, match=r"server\.crt"):
        server_ssl_context(files / "server.crt", files / "ca.key", files / "ca.crt")
    with pytest.raises(TlsConfigurationError, match="without its certificate"):
        client_ssl_context(files / "ca.crt", key_path=files / "server.key")


@pytest.mark.parametrize("name", ["ca.crt", "server.crt", "server.key"])
def test_a_tls_file_that_is_a_fifo_is_refused_without_waiting_for_a_writer(
    files: Path, name: str
) -> None:
    (files / name).unlink()
    os.mkfifo(files / name)

    with pytest.raises(TlsConfigurationError) as refused:
        server_ssl_context(files / "server.crt", files / "server.key", files / "ca.crt")
    assert str(refused.value).endswith(
        f"{files / name}: not a regular file but a named pipe (FIFO)"
    )
    with pytest.raises(TlsConfigurationError, match="not a regular file but a named pipe"):
        client_ssl_context(files / "ca.crt", files / "server.crt", files / "server.key")


def test_a_device_as_the_ca_is_refused_rather_than_read_whole(files: Path) -> None:
    with pytest.raises(TlsConfigurationError, match="/dev/zero: not a regular file but a char"):
        client_ssl_context(Path("/dev/zero"))


def test_a_certificate_with_subject_alternative_names_alone_is_refused_saying_so(
    ca: CertificateAuthority,
) -> None:
    """Signed by the CA, a node's in every way but its common name, left out for a DNS
    name: the refusal says what is missing, not that the empty name is invalid."""
    key = generate_key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "node"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW)
        .not_valid_after(NOW + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("gpu-07")]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )

    with pytest.raises(CertificateRejected) as refused:
        peer_identity(certificate, expect=CertificateKind.NODE)

    assert str(refused.value) == (
        "certificate 'O=llmgw,OU=node' has no common name: a node certificate's common name "
        "is its node id (subject alternative names are not read for it)"
    )


def test_a_server_certificate_that_expired_is_refused_before_any_handshake(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    write_ca(tmp_path, ca, force=False)
    key = generate_key()
    expired = issue_server(ca, key, ["localhost"], [], datetime.now(UTC) - timedelta(days=3), 1)
    write_issued(tmp_path, "server", expired, key, force=False)

    with pytest.raises(TlsConfigurationError) as refused:
        server_ssl_context(tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt")
    assert str(refused.value) == (
        f"the certificate {tmp_path / 'server.crt'} expired at "
        f"{expired.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: issue a new one "
        "(`llmgw-cli cert server`, where the llmgw CA is kept)"
    )


def test_a_certificate_for_the_other_end_is_refused_before_any_handshake(
    files: Path, ca: CertificateAuthority
) -> None:
    key = generate_key()
    write_issued(
        files, "node", issue_node(ca, key, "gpu-07", datetime.now(UTC), 1), key, force=False
    )

    with pytest.raises(TlsConfigurationError) as as_server:
        server_ssl_context(files / "node.crt", files / "node.key", files / "ca.crt")
    with pytest.raises(TlsConfigurationError) as as_client:
        client_ssl_context(files / "ca.crt", files / "server.crt", files / "server.key")

    assert str(as_server.value) == (
        f"the certificate {files / 'node.crt'} is a node certificate, not one for a TLS "
        "server: give the one `llmgw-cli cert server` issued"
    )
    assert str(as_client.value) == (
        f"the certificate {files / 'server.crt'} is a server certificate, not one for a TLS "
        "client: give the one `llmgw-cli cert node` (or `cert operator`) issued"
    )


def test_a_ca_bundle_holding_a_certificate_that_is_no_ca_is_refused(files: Path) -> None:
    with pytest.raises(TlsConfigurationError) as refused:
        server_ssl_context(files / "server.crt", files / "server.key", files / "server.crt")

    assert str(refused.value) == (
        f"the CA certificate {files / 'server.crt'} holds 'localhost', a server certificate, "
        "not a CA: give the CA's own certificate (ca.crt, written by `llmgw-cli cert init-ca`)"
    )


def test_a_file_that_holds_no_pem_or_the_wrong_key_is_named_with_what_it_lacks(
    files: Path, ca: CertificateAuthority
) -> None:
    (files / "notes.txt").write_text("not a certificate\n")
    other_key = generate_key()
    write_issued(
        files,
        "other",
        issue_node(ca, other_key, "gpu-07", datetime.now(UTC), 1),
        other_key,
        force=False,
    )
    server_crt, server_key, ca_crt = files / "server.crt", files / "server.key", files / "ca.crt"

    refusals = []
    for cert, key in (
        (files / "notes.txt", server_key),
        (server_crt, files / "notes.txt"),
        (server_crt, files / "other.key"),
    ):
        with pytest.raises(TlsConfigurationError) as refused:
            server_ssl_context(cert, key, ca_crt)
        refusals.append(str(refused.value))

    assert refusals == [
        f"cannot load the certificate {files / 'notes.txt'} with key {server_key}: "
        f"{files / 'notes.txt'} holds no PEM certificate",
        f"cannot load the certificate {server_crt} with key {files / 'notes.txt'}: "
        f"{files / 'notes.txt'} holds no PEM private key",
        f"cannot load the certificate {server_crt} with key {files / 'other.key'}: the key is "
        "not the certificate's: give the key issued with it",
    ]
