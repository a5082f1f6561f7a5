"""What a certificate says, in words an operator can check."""

from __future__ import annotations

from datetime import datetime

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.pki.model import CertificateKind, require_aware


class CertificateDescription(msgspec.Struct, frozen=True, kw_only=True):
    subject: str
    common_name: str
    organizational_unit: str
    kind: CertificateKind
    issuer: str
    self_signed: bool
    is_ca: bool
    serial: str
    sha256_fingerprint: str
    public_key: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    key_usages: tuple[str, ...]
    extended_key_usages: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    expired: bool
    not_yet_valid: bool


_EXTENDED_USAGE_WORDS = {
    ExtendedKeyUsageOID.SERVER_AUTH: "server authentication",
    ExtendedKeyUsageOID.CLIENT_AUTH: "client authentication",
    ExtendedKeyUsageOID.CODE_SIGNING: "code signing",
    ExtendedKeyUsageOID.EMAIL_PROTECTION: "email protection",
    ExtendedKeyUsageOID.TIME_STAMPING: "time stamping",
    ExtendedKeyUsageOID.OCSP_SIGNING: "OCSP signing",
}

_CURVE_WORDS = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}


def describe(certificate: x509.Certificate, now: datetime) -> CertificateDescription:
    require_aware(now)
    dns_names, ip_addresses = alternative_names(certificate)
    return CertificateDescription(
        subject=certificate.subject.rfc4514_string(),
        common_name=_attribute(certificate.subject, NameOID.COMMON_NAME),
        organizational_unit=_attribute(certificate.subject, NameOID.ORGANIZATIONAL_UNIT_NAME),
        kind=kind_of(certificate),
        issuer=certificate.issuer.rfc4514_string(),
        self_signed=certificate.issuer == certificate.subject,
        is_ca=is_ca(certificate),
        serial=serial_hex(certificate),
        sha256_fingerprint=certificate.fingerprint(hashes.SHA256()).hex(":").upper(),
        public_key=_public_key_words(certificate),
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        key_usages=_key_usage_words(certificate),
        extended_key_usages=tuple(
            _EXTENDED_USAGE_WORDS.get(oid, oid.dotted_string)
            for oid in extended_key_usages(certificate)
        ),
        not_before=certificate.not_valid_before_utc,
        not_after=certificate.not_valid_after_utc,
        expired=now > certificate.not_valid_after_utc,
        not_yet_valid=now < certificate.not_valid_before_utc,
    )


def kind_of(certificate: x509.Certificate) -> CertificateKind:
    """What llmgw would use this certificate as, judged from its extensions and OU."""
    if is_ca(certificate):
        return CertificateKind.CA
    usages = extended_key_usages(certificate)
    unit = _attribute(certificate.subject, NameOID.ORGANIZATIONAL_UNIT_NAME)
    client_kinds = {CertificateKind.NODE.value, CertificateKind.OPERATOR.value}
    if unit in client_kinds and ExtendedKeyUsageOID.CLIENT_AUTH in usages:
        return CertificateKind(unit)
    if unit not in client_kinds and ExtendedKeyUsageOID.SERVER_AUTH in usages:
        return CertificateKind.SERVER
    return CertificateKind.UNKNOWN


def is_ca(certificate: x509.Certificate) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    return constraints.value.ca


def extended_key_usages(certificate: x509.Certificate) -> tuple[x509.ObjectIdentifier, ...]:
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    except x509.ExtensionNotFound:
        return ()
    return tuple(usages.value)


def serial_hex(certificate: x509.Certificate) -> str:
    """The serial number as llmgw names it everywhere: lower-case hex, no separators."""
    return format(certificate.serial_number, "x")


def common_name(certificate: x509.Certificate) -> str:
    return _attribute(certificate.subject, NameOID.COMMON_NAME)


def _attribute(name: x509.Name, oid: x509.ObjectIdentifier) -> str:
    values = name.get_attributes_for_oid(oid)
    if not values:
        return ""
    value = values[0].value
    return value if isinstance(value, str) else value.decode(errors="replace")


def alternative_names(certificate: x509.Certificate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The DNS names and the IP addresses among the subject alternative names."""
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return (), ()
    dns_names = tuple(sans.get_values_for_type(x509.DNSName))
    ip_addresses = tuple(str(address) for address in sans.get_values_for_type(x509.IPAddress))
    return dns_names, ip_addresses


def _key_usage_words(certificate: x509.Certificate) -> tuple[str, ...]:
    try:
        usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return ()
    words = [
        ("digital signature", usage.digital_signature),
        ("content commitment", usage.content_commitment),
        ("key encipherment", usage.key_encipherment),
        ("data encipherment", usage.data_encipherment),
        ("key agreement", usage.key_agreement),
        ("certificate signing", usage.key_cert_sign),
        ("CRL signing", usage.crl_sign),
    ]
    if usage.key_agreement:
        words += [("encipher only", usage.encipher_only), ("decipher only", usage.decipher_only)]
    return tuple(word for word, present in words if present)


def _public_key_words(certificate: x509.Certificate) -> str:
    key = certificate.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"ECDSA {_CURVE_WORDS.get(key.curve.name, key.curve.name)}"
    return type(key).__name__.removeprefix("_")
