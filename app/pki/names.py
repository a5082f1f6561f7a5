"""Validation of the names that go into certificates, and the ``llmgw-cli cert`` flag that
puts an address into one (``--ip`` or ``--host``)."""

from __future__ import annotations

import ipaddress
import re

from app.pki.errors import InvalidRequest

_SUBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""Led by a letter or digit: ``.`` and ``..`` are dot segments that a URL path collapses
(``/nodes/../drain`` is ``/drain``), and a leading ``-`` is read as an option."""
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def check_subject_name(what: str, name: str) -> str:
    """Return `name` if it is a usable node id or operator name, else raise InvalidRequest."""
    if not _SUBJECT_NAME.fullmatch(name):
        raise InvalidRequest(
            f"invalid {what} {name!r}: use 1-63 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit"
        )
    return name


def check_host(host: str) -> str:
    """Return `host` if it is a DNS name a certificate can carry, else raise InvalidRequest."""
    if is_ip_address(host):
        raise InvalidRequest(
            f"{host!r} is an IP address, not a host name: pass it with --ip so that "
            "clients dialling it can verify the certificate"
        )
    labels = host.removeprefix("*.").split(".")
    if len(host) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise InvalidRequest(
            f"invalid host name {host!r}: use dot-separated labels of letters, digits and '-'"
        )
    return host


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Parse an IPv4 or IPv6 address, raising InvalidRequest with the offending text."""
    try:
        return ipaddress.ip_address(text)
    except ValueError as exc:
        if _is_host_name(text):
            raise InvalidRequest(
                f"{text!r} is a host name, not an IP address: pass it with --host so that "
                "clients dialling it can verify the certificate"
            ) from exc
        raise InvalidRequest(f"invalid IP address {text!r}") from exc


def _is_host_name(text: str) -> bool:
    """Whether ``text`` is a DNS name and not a mistyped IPv4 address: its last label is no
    number (no top-level domain is), so ``10.0.0.999`` is not taken for one."""
    try:
        check_host(text)
    except InvalidRequest:
        return False
    return not text.rsplit(".", 1)[-1].isdigit()


def is_ip_address(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address; anything else a certificate names as a
    host."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def address_flag(address: str) -> str:
    """The ``llmgw-cli cert`` flag that names ``address`` in a certificate: ``--ip`` for an
    IP address, ``--host`` for a host name."""
    return "--ip" if is_ip_address(address) else "--host"
