"""explain_tls_failure(): the operator reads what went wrong and the command that fixes it.

The errors are built here with the fields OpenSSL fills in; the integration tests
feed the function errors from real handshakes.
"""

from __future__ import annotations

import ipaddress
import ssl
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509

from app.pki.builders import build_ca, issue, issue_server
from app.pki.explain import explain_tls_failure
from app.pki.keys import generate_key
from app.pki.model import CertificateAuthority, Usage, Validity

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

IP_ADDRESS_MISMATCH = 64
HOSTNAME_MISMATCH = 62
CERT_HAS_EXPIRED = 10
CERT_NOT_YET_VALID = 9
UNABLE_TO_GET_ISSUER_CERT_LOCALLY = 20
INVALID_PURPOSE = 26


def verification_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(
        1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}"
    )
    error.verify_code = code
    error.verify_message = message
    return error


def alert(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] alert")
    error.reason = reason
    return error


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return build_ca(generate_key(), "llmgw CA", NOW, 3650)


@pytest.fixture(scope="module")
def server_certificate(ca: CertificateAuthority) -> x509.Certificate:
    return issue_server(
        ca, generate_key(), ["llmgw.internal"], [ipaddress.ip_address("127.0.0.2")], NOW, 825
    )


def test_a_dialled_ip_missing_from_the_sans_is_named_with_the_sans_and_the_fix(
    server_certificate: x509.Certificate,
) -> None:
    error = verification_error(
        IP_ADDRESS_MISMATCH, "IP address mismatch, certificate is not valid for '127.0.0.5'."
    )

    message = explain_tls_failure(error, "127.0.0.5", server_certificate)

    assert "not valid for 127.0.0.5" in message
    assert "that IP address is not among its subject alternative names" in message
    assert "DNS:llmgw.internal, IP:127.0.0.2" in message
    assert (
        "`llmgw-cli cert server --host llmgw.internal --ip 127.0.0.2 --ip 127.0.0.5 --force`"
        in message
    )
    # The CA is kept off the servers (docs/certificates.md): the certificate is reissued
    # there and installed on the control plane.
    assert (
        "Reissue it where the llmgw CA is kept, with every host and IP that agents and "
        "operators dial, install it on the control plane and restart llmgw-server"
    ) in message


def test_a_dialled_host_missing_from_the_sans_is_added_as_a_host(
    server_certificate: x509.Certificate,
) -> None:
    error = verification_error(HOSTNAME_MISMATCH, "Hostname mismatch")

    message = explain_tls_failure(error, "gw.example.com", server_certificate)

    assert "that host name is not among its subject alternative names" in message
    assert "--host llmgw.internal --host gw.example.com --ip 127.0.0.2 --force" in message


def test_without_the_presented_certificate_the_fix_still_names_the_dialled_ip() -> None:
    error = verification_error(IP_ADDRESS_MISMATCH, "IP address mismatch")

    message = explain_tls_failure(error, "127.0.0.5")

    assert "not valid for 127.0.0.5" in message
    assert "llmgw-cli cert show server.crt" in message
    assert "llmgw-cli cert server --ip 127.0.0.5" in message


def test_a_bracketed_ipv6_address_is_recognised_as_an_ip() -> None:
    error = verification_error(IP_ADDRESS_MISMATCH, "IP address mismatch")

    message = explain_tls_failure(error, "[::1]")

    assert "not valid for ::1: that IP address" in message
    assert "--ip ::1" in message


def test_an_expired_server_certificate_says_when_and_how_to_reissue(
    ca: CertificateAuthority,
) -> None:
    expired = issue(
        ca,
        generate_key(),
        common_name="llmgw.internal",
        unit="server",
        usages=(Usage.SERVER_AUTH,),
        validity=Validity(NOW - timedelta(days=30), NOW - timedelta(days=1)),
        dns_names=["llmgw.internal"],
    )

    message = explain_tls_failure(
        verification_error(CERT_HAS_EXPIRED, "certificate has expired"),
        "llmgw.internal",
        expired,
    )

    assert "expired on 2029-12-31 12:00 UTC" in message
    assert "llmgw-cli cert server --host llmgw.internal --force" in message
    # Issued where the CA is kept (docs/certificates.md), as every other advice says.
    assert "issue a new one where the llmgw CA is kept (never on a server)" in message
    assert "issue a new one on the control plane" not in message


def test_a_certificate_not_valid_yet_points_at_the_clocks() -> None:
    error = verification_error(CERT_NOT_YET_VALID, "certificate is not yet valid")

    assert "check the clocks" in explain_tls_failure(error, "llmgw.internal")


def test_a_certificate_not_valid_yet_says_from_when_it_is(
    server_certificate: x509.Certificate,
) -> None:
    """As an agent whose clock is hours behind the CA's sees the server's certificate."""
    error = verification_error(CERT_NOT_YET_VALID, "certificate is not yet valid")

    assert explain_tls_failure(error, "llmgw.internal", server_certificate) == (
        "the server certificate of llmgw.internal is valid only from "
        f"{server_certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC, later than this "
        "machine's clock says it is: check the clocks of this machine and of the machine that "
        "issued it (NTP)"
    )


def test_an_unknown_issuer_names_who_issued_the_presented_certificate(
    server_certificate: x509.Certificate,
) -> None:
    error = verification_error(
        UNABLE_TO_GET_ISSUER_CERT_LOCALLY, "unable to get local issuer certificate"
    )

    message = explain_tls_failure(error, "llmgw.internal", server_certificate)

    assert "not issued by the CA this side trusts" in message
    assert "issued by O=llmgw,CN=llmgw CA" in message
    assert "ca.crt" in message


def test_a_certificate_without_server_auth_is_not_a_server_certificate() -> None:
    error = verification_error(INVALID_PURPOSE, "unsuitable certificate purpose")

    assert "not a server certificate" in explain_tls_failure(error, "llmgw.internal")


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "requires a client certificate"),
        ("TLSV1_ALERT_UNKNOWN_CA", "does not trust the CA that issued this side's client"),
        ("SSLV3_ALERT_CERTIFICATE_EXPIRED", "because it has expired"),
        ("SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "not issued for client authentication"),
        ("WRONG_VERSION_NUMBER", "did not answer with TLS"),
    ],
)
def test_refusals_of_this_sides_certificate_say_which_certificate_to_issue(
    reason: str, expected: str
) -> None:
    message = explain_tls_failure(alert(reason), "llmgw.internal")

    assert expected in message
    assert message.startswith("llmgw.internal ")


def test_an_ssl_error_wrapped_by_a_library_is_still_found() -> None:
    try:
        try:
            raise verification_error(IP_ADDRESS_MISMATCH, "IP address mismatch")
        except ssl.SSLError as exc:
            raise ConnectionError("handshake failed") from exc
    except ConnectionError as wrapped:
        message = explain_tls_failure(wrapped, "127.0.0.5")

    assert "not valid for 127.0.0.5" in message


def test_other_errors_are_reported_as_they_are() -> None:
    message = explain_tls_failure(ConnectionRefusedError(111, "Connection refused"), "127.0.0.5")

    assert message == "could not connect to 127.0.0.5: [Errno 111] Connection refused"
