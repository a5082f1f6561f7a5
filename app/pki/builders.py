"""Pure certificate building: keys, the clock and serials come in, certificates come out.

Leaf certificates name what they are for twice: an extended key usage that TLS
enforces (serverAuth or clientAuth) and an organizational unit (`server`, `node`,
`operator`) that lets the agent hub refuse an operator certificate and the admin
API a node certificate, both issued by the same CA.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.pki.errors import InvalidRequest
from app.pki.keys import PrivateKey, PublicKey
from app.pki.model import (
    ORGANIZATION,
    CertificateAuthority,
    CertificateKind,
    Usage,
    Validity,
)
from app.pki.names import check_host, check_subject_name

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SubjectKey = PrivateKey | PublicKey

_MAX_COMMON_NAME = 64


def build_ca(key: PrivateKey, common_name: str, now: datetime, days: int) -> CertificateAuthority:
    """A self-signed root that may sign leaf certificates only (path length 0)."""
    _check_common_name(common_name)
    _check_curve(key.public_key())
    validity = Validity.starting(now, days)
    subject = _name(common_name, unit=None)
    public_key = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity.not_before)
        .not_valid_after(validity.not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(certificate_signing=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(certificate=certificate, key=key)


def issue_server(
    ca: CertificateAuthority,
    key: SubjectKey,
    hosts: Sequence[str],
    ips: Sequence[IPAddress],
    now: datetime,
    days: int,
) -> x509.Certificate:
    """A serverAuth certificate naming every host and IP clients dial as SANs."""
    unique_hosts = tuple(dict.fromkeys(check_host(host) for host in hosts))
    unique_ips = tuple(dict.fromkeys(ips))
    if not unique_hosts and not unique_ips:
        raise InvalidRequest("a server certificate needs at least one host name or IP address")
    names = [*unique_hosts, *(str(address) for address in unique_ips)]
    common_name = next((name for name in names if len(name) <= _MAX_COMMON_NAME), "llmgw server")
    return issue(
        ca,
        key,
        common_name=common_name,
        unit=CertificateKind.SERVER,
        usages=(Usage.SERVER_AUTH,),
        validity=Validity.within(ca, now, days),
        dns_names=unique_hosts,
        ip_addresses=unique_ips,
    )


def issue_node(
    ca: CertificateAuthority,
    key: SubjectKey,
    node_id: str,
    now: datetime,
    days: int,
    *,
    hosts: Sequence[str] = (),
    ips: Sequence[IPAddress] = (),
) -> x509.Certificate:
    """A clientAuth certificate whose common name is the node id the agent will claim, and
    whose subject alternative names are the addresses it may advertise for its engines."""
    return issue(
        ca,
        key,
        common_name=check_subject_name("node id", node_id),
        unit=CertificateKind.NODE,
        usages=(Usage.CLIENT_AUTH,),
        validity=Validity.within(ca, now, days),
        dns_names=tuple(dict.fromkeys(check_host(host) for host in hosts)),
        ip_addresses=tuple(dict.fromkeys(ips)),
    )


def issue_operator(
    ca: CertificateAuthority, key: SubjectKey, name: str, now: datetime, days: int
) -> x509.Certificate:
    """A clientAuth certificate for one person or tool calling the admin API."""
    return issue(
        ca,
        key,
        common_name=check_subject_name("operator name", name),
        unit=CertificateKind.OPERATOR,
        usages=(Usage.CLIENT_AUTH,),
        validity=Validity.within(ca, now, days),
    )


def issue(
    ca: CertificateAuthority,
    key: SubjectKey,
    *,
    common_name: str,
    unit: str | None,
    usages: Sequence[Usage],
    validity: Validity,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[IPAddress] = (),
    serial: int | None = None,
) -> x509.Certificate:
    """Any leaf certificate, usages and validity as given: also the way to build bad ones.

    Nothing here checks that the result is sensible; the named builders above do.
    """
    _check_common_name(common_name)
    public_key = _public(key)
    _check_curve(public_key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, unit))
        .issuer_name(ca.certificate.subject)
        .public_key(public_key)
        .serial_number(serial if serial is not None else x509.random_serial_number())
        .not_valid_before(validity.not_before)
        .not_valid_after(validity.not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(certificate_signing=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(_authority_key_identifier(ca), critical=False)
    )
    if usages:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([usage.oid for usage in usages]), critical=False
        )
    alternative_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alternative_names += [x509.IPAddress(address) for address in ip_addresses]
    if alternative_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(alternative_names), critical=False
        )
    return builder.sign(ca.key, hashes.SHA256())


def _name(common_name: str, unit: str | None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if unit is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION))
    return x509.Name(attributes)


def _key_usage(*, certificate_signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=certificate_signing,
        crl_sign=certificate_signing,
        encipher_only=False,
        decipher_only=False,
    )


def _authority_key_identifier(ca: CertificateAuthority) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)


def _public(key: SubjectKey) -> PublicKey:
    return key.public_key() if isinstance(key, PrivateKey) else key


def _check_curve(key: PublicKey) -> None:
    if not isinstance(key.curve, ec.SECP256R1):
        raise InvalidRequest(f"keys must be ECDSA P-256, not {key.curve.name}")


def _check_common_name(common_name: str) -> None:
    if not 1 <= len(common_name) <= _MAX_COMMON_NAME:
        raise InvalidRequest(
            f"a common name must be 1-{_MAX_COMMON_NAME} characters, not {len(common_name)}"
        )
