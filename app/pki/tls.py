"""TLS for the agent channel and the admin API: contexts, and who is on the other end.

Every accepted connection must go through `peer_identity()`. The handshake has
already proved the peer's certificate chains to the llmgw CA, is in date and
(OpenSSL checks the purpose on the server side) carries clientAuth; `peer_identity()`
checks that again, because nothing else stops a context built elsewhere from
skipping it, and then refuses the kinds of certificate a listener must not accept:
the agent hub takes node certificates only, the admin API operator certificates only.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from app.pki.describe import (
    alternative_names,
    common_name,
    extended_key_usages,
    is_ca,
    kind_of,
    serial_hex,
)
from app.pki.errors import (
    CertificateNotYetValid,
    CertificateRejected,
    InvalidRequest,
    TlsConfigurationError,
)
from app.pki.limits import MAX_PEM_FILE_BYTES
from app.pki.model import CLOCK_SKEW, CertificateKind
from app.pki.names import check_subject_name
from app.regular_file import FileRefused, check_regular_file

PathLike = str | os.PathLike[str]
PeerCertificate = ssl.SSLObject | ssl.SSLSocket | bytes | x509.Certificate

_CLIENT_KINDS = (CertificateKind.NODE, CertificateKind.OPERATOR)


@dataclass(frozen=True)
class PeerIdentity:
    common_name: str
    kind: CertificateKind
    subject: str
    serial: str = ""
    """The serial number in lower-case hex, as `llmgw-cli cert show` prints it."""
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    issued_at: datetime | None = None
    """When the CA issued it: not_before plus the clock-skew allowance it was backdated by."""
    expires_at: datetime | None = None
    """Its not_after: the handshake checked it once, a long connection must check it again."""


def server_ssl_context(
    cert_path: PathLike,
    key_path: PathLike,
    ca_path: PathLike,
    require_client_cert: bool = True,
) -> ssl.SSLContext:
    """TLS 1.2+; client certificates must chain to the CA in `ca_path`.

    With `require_client_cert` off a client may connect without a certificate, but
    one it does present is still verified.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    _load_trusted_ca(context, ca_path)
    _load_own_certificate(context, cert_path, key_path, ExtendedKeyUsageOID.SERVER_AUTH)
    return context


def client_ssl_context(
    ca_path: PathLike, cert_path: PathLike | None = None, key_path: PathLike | None = None
) -> ssl.SSLContext:
    """TLS 1.2+, trusting only the CA in `ca_path`, checking the dialled host against SANs."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.hostname_checks_common_name = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    _load_trusted_ca(context, ca_path)
    if cert_path is not None:
        _load_own_certificate(context, cert_path, key_path, ExtendedKeyUsageOID.CLIENT_AUTH)
    elif key_path is not None:
        raise TlsConfigurationError("a client key was given without its certificate")
    return context


def peer_identity(peer: PeerCertificate, expect: CertificateKind | None = None) -> PeerIdentity:
    """Who the verified peer is; raises CertificateRejected if llmgw must not accept it.

    `peer` is the connection's ssl object (`transport.get_extra_info("ssl_object")`),
    or the peer certificate as DER bytes (`getpeercert(binary_form=True)`) or parsed.
    `expect` narrows the accepted kinds to one: NODE for the hub, OPERATOR for the admin API.
    """
    certificate = _peer_certificate(peer)
    subject = certificate.subject.rfc4514_string()
    if ExtendedKeyUsageOID.CLIENT_AUTH not in extended_key_usages(certificate):
        raise CertificateRejected(
            f"certificate {subject!r} is not issued for client authentication (no clientAuth)"
        )
    kind = kind_of(certificate)
    if kind not in _CLIENT_KINDS:
        raise CertificateRejected(f"certificate {subject!r} is not a node or operator certificate")
    if expect is not None and kind != expect:
        raise CertificateRejected(
            f"certificate {subject!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} "
            f"certificate; only {expect} certificates are accepted here"
        )
    if not common_name(certificate):
        raise CertificateRejected(
            f"certificate {subject!r} has no common name: a {kind} certificate's common name "
            f"is its {'node id' if kind == CertificateKind.NODE else 'operator name'} "
            "(subject alternative names are not read for it)"
        )
    try:
        name = check_subject_name(f"{kind} name", common_name(certificate))
    except InvalidRequest as exc:
        raise CertificateRejected(f"certificate {subject!r}: {exc}") from exc
    dns_names, ip_addresses = alternative_names(certificate)
    return PeerIdentity(
        common_name=name,
        kind=kind,
        subject=subject,
        serial=serial_hex(certificate),
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        issued_at=certificate.not_valid_before_utc + CLOCK_SKEW,
        expires_at=certificate.not_valid_after_utc,
    )


def fetch_presented_certificate(
    host: str, port: int, *, timeout: float = 5.0
) -> x509.Certificate | None:
    """The certificate a server presents, read without verifying it; None if unreachable.

    Only for explaining a failed handshake (see `explain_tls_failure`): it blocks, so
    call it through `asyncio.to_thread` from async code.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as connection,
        ):
            der = connection.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der) if der else None
    except (OSError, ValueError):
        return None


def _peer_certificate(peer: PeerCertificate) -> x509.Certificate:
    if isinstance(peer, x509.Certificate):
        return peer
    if isinstance(peer, bytes):
        der: bytes | None = peer
    else:
        if peer.context.verify_mode == ssl.CERT_NONE:
            raise CertificateRejected("the connection does not verify peer certificates")
        der = peer.getpeercert(binary_form=True)
    if not der:
        raise CertificateRejected("the peer presented no certificate")
    try:
        return x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise CertificateRejected(f"the peer certificate cannot be parsed: {exc}") from exc


def _load_trusted_ca(context: ssl.SSLContext, ca_path: PathLike) -> None:
    try:
        check_regular_file(Path(ca_path), MAX_PEM_FILE_BYTES)
    except FileRefused as exc:
        raise TlsConfigurationError(f"cannot load the CA certificate {exc}") from exc
    try:
        context.load_verify_locations(cafile=ca_path)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigurationError(f"cannot load the CA certificate {ca_path}: {exc}") from exc
    # OpenSSL trusts whatever the file holds as an anchor; a server's or a node's own
    # certificate given there by mistake would fail every handshake, not the start.
    for certificate in _certificates(ca_path):
        if not is_ca(certificate):
            raise TlsConfigurationError(
                f"the CA certificate {ca_path} holds {common_name(certificate)!r}, a "
                f"{kind_of(certificate).value} certificate, not a CA: give the CA's own "
                "certificate (ca.crt, written by `llmgw-cli cert init-ca`)"
            )


def _load_own_certificate(
    context: ssl.SSLContext,
    cert_path: PathLike,
    key_path: PathLike | None,
    usage: x509.ObjectIdentifier,
) -> None:
    for path in (cert_path, key_path):
        try:
            if path is not None:
                check_regular_file(Path(path), MAX_PEM_FILE_BYTES)
        except FileRefused as exc:
            raise TlsConfigurationError(f"cannot load the certificate or key {exc}") from exc
    try:
        context.load_cert_chain(certfile=cert_path, keyfile=key_path)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigurationError(
            f"cannot load the certificate {cert_path} with key {key_path}: "
            f"{_not_pem(cert_path, key_path) or _mismatch(exc) or exc}"
        ) from exc
    _check_own_certificate(cert_path, _certificates(cert_path)[0], usage)


def _not_pem(cert_path: PathLike, key_path: PathLike | None) -> str | None:
    """Which of the two files holds no PEM block of its kind (OpenSSL says only "PEM
    lib"), or None when both do."""
    for path, marker, what in (
        (cert_path, b"-----BEGIN CERTIFICATE-----", "certificate"),
        (key_path or cert_path, b"PRIVATE KEY-----", "private key"),
    ):
        try:
            if marker not in Path(path).read_bytes():
                return f"{path} holds no PEM {what}"
        except OSError:
            return None
    return None


def _mismatch(error: OSError) -> str | None:
    if isinstance(error, ssl.SSLError) and error.reason == "KEY_VALUES_MISMATCH":
        return "the key is not the certificate's: give the key issued with it"
    return None


_ISSUED_FOR = {
    "server": "`llmgw-cli cert server`",
    "client": "`llmgw-cli cert node` (or `cert operator`)",
}


def _check_own_certificate(
    cert_path: PathLike, certificate: x509.Certificate, usage: x509.ObjectIdentifier
) -> None:
    """Refuse, at start, a certificate every peer would refuse at each handshake: out of
    date, or not for this end of the connection."""
    now = datetime.now(UTC)
    if certificate.not_valid_after_utc <= now:
        expired = f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M}"
        raise TlsConfigurationError(
            f"the certificate {cert_path} expired at {expired} UTC: issue a new one "
            f"({_reissue(certificate)}, where the llmgw CA is kept)"
        )
    if certificate.not_valid_before_utc > now + CLOCK_SKEW:
        raise CertificateNotYetValid(
            f"the certificate {cert_path} is valid only from "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC, and this machine's clock "
            f"says {now:%Y-%m-%d %H:%M} UTC: check this machine's clock (NTP)"
        )
    usages = extended_key_usages(certificate)
    if usages and usage not in usages:
        wanted = "server" if usage == ExtendedKeyUsageOID.SERVER_AUTH else "client"
        raise TlsConfigurationError(
            f"the certificate {cert_path} is a {kind_of(certificate).value} certificate, "
            f"not one for a TLS {wanted}: give the one {_ISSUED_FOR[wanted]} issued"
        )


def _reissue(certificate: x509.Certificate) -> str:
    """The command that issues a certificate like ``certificate`` again."""
    kind = kind_of(certificate)
    if kind in (CertificateKind.NODE, CertificateKind.OPERATOR):
        return f"`llmgw-cli cert {kind.value} {common_name(certificate)}`"
    if kind is CertificateKind.SERVER:
        return "`llmgw-cli cert server`"
    return "`llmgw-cli cert`"


def _certificates(path: PathLike) -> list[x509.Certificate]:
    """The PEM certificates in ``path``, which OpenSSL has just loaded."""
    try:
        return x509.load_pem_x509_certificates(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise TlsConfigurationError(f"cannot read the certificates in {path}: {exc}") from exc
