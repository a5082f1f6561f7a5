"""Failed TLS handshakes, explained to the operator who has to fix them."""

from __future__ import annotations

import ipaddress
import ssl

from cryptography import x509

from app.pki.describe import alternative_names
from app.pki.model import CLOCK_SKEW
from app.pki.names import address_flag, is_ip_address

# OpenSSL X509_V_ERR_* codes, as found in SSLCertVerificationError.verify_code.
_UNABLE_TO_GET_ISSUER_CERT = 2
_CERT_SIGNATURE_FAILURE = 7
_CERT_NOT_YET_VALID = 9
_CERT_HAS_EXPIRED = 10
_DEPTH_ZERO_SELF_SIGNED_CERT = 18
_SELF_SIGNED_CERT_IN_CHAIN = 19
_UNABLE_TO_GET_ISSUER_CERT_LOCALLY = 20
_UNABLE_TO_VERIFY_LEAF_SIGNATURE = 21
_INVALID_PURPOSE = 26
_HOSTNAME_MISMATCH = 62
_IP_ADDRESS_MISMATCH = 64

_UNKNOWN_ISSUER = {
    _UNABLE_TO_GET_ISSUER_CERT,
    _CERT_SIGNATURE_FAILURE,
    _DEPTH_ZERO_SELF_SIGNED_CERT,
    _SELF_SIGNED_CERT_IN_CHAIN,
    _UNABLE_TO_GET_ISSUER_CERT_LOCALLY,
    _UNABLE_TO_VERIFY_LEAF_SIGNATURE,
}

_CLIENT_CERTIFICATE_COMMANDS = (
    "`llmgw-cli cert node <node-id>` for an agent, `llmgw-cli cert operator <name>` for an operator"
)


def explain_tls_failure(
    exc: BaseException, dialled_host: str, presented: x509.Certificate | None = None
) -> str:
    """One line saying why TLS with `dialled_host` failed and what fixes it.

    `presented` is the certificate the server showed, if the caller fetched it (see
    `fetch_presented_certificate`); with it the message names what it does contain.
    """
    host = dialled_host.removeprefix("[").removesuffix("]")
    error = ssl_error_in(exc)
    if isinstance(error, ssl.SSLCertVerificationError):
        return _explain_verification(error, host, presented)
    if error is not None:
        return _explain_refusal(error, host)
    return f"could not connect to {host}: {exc}"


def explain_node_certificate_refusal(error: ssl.SSLCertVerificationError) -> str:
    """Why the agent hub's TLS handshake refused a node certificate, and what fixes it:
    said on the server, since the agent is told nothing (asyncio closes without an alert)."""
    code = error.verify_code
    if code == _CERT_HAS_EXPIRED:
        return (
            "the node certificate has expired: issue the node a new one where the llmgw CA "
            "is kept (`llmgw-cli cert node <node-id> --force`) and restart its agent"
        )
    if code == _CERT_NOT_YET_VALID:
        return (
            "the node certificate is not valid yet by this server's clock: this server's "
            "clock, or that of the machine that issued it, is ahead by more than "
            f"{CLOCK_SKEW.total_seconds() / 60:g} minutes"
        )
    if code in _UNKNOWN_ISSUER:
        return (
            f"the node certificate was not issued by the CA this server trusts "
            f"({error.verify_message}): issue it from the CA whose ca.crt the server was given"
        )
    return f"the node certificate failed verification: {error.verify_message}"


def _explain_verification(
    error: ssl.SSLCertVerificationError, host: str, presented: x509.Certificate | None
) -> str:
    code = error.verify_code
    if code in (_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH):
        return _explain_missing_name(host, presented)
    if code == _CERT_HAS_EXPIRED:
        when = f" on {presented.not_valid_after_utc:%Y-%m-%d %H:%M} UTC" if presented else ""
        return (
            f"the server certificate of {host} expired{when}: issue a new one where the llmgw "
            "CA is kept (never on a server), install it on the control plane and restart "
            f"llmgw-server: `{_reissue_command(host, presented)}`"
        )
    if code == _CERT_NOT_YET_VALID:
        when = (
            f"is valid only from {presented.not_valid_before_utc:%Y-%m-%d %H:%M} UTC, later "
            "than this machine's clock says it is"
            if presented
            else "is not valid yet by this machine's clock"
        )
        return (
            f"the server certificate of {host} {when}: check the clocks of this machine and "
            "of the machine that issued it (NTP)"
        )
    if code in _UNKNOWN_ISSUER:
        issuer = f" (it was issued by {presented.issuer.rfc4514_string()})" if presented else ""
        return (
            f"the server certificate of {host} was not issued by the CA this side trusts"
            f"{issuer}: {error.verify_message}. Give this side the ca.crt of the llmgw CA "
            "that issued the server certificate; `llmgw-cli cert show` on both files shows "
            "the issuer and the CA's subject"
        )
    if code == _INVALID_PURPOSE:
        return (
            f"the certificate {host} presented is not a server certificate (no serverAuth "
            f"usage): issue one where the llmgw CA is kept and install it on the control "
            f"plane: `{_reissue_command(host, presented)}`"
        )
    return f"the server certificate of {host} failed verification: {error.verify_message}"


def _explain_missing_name(host: str, presented: x509.Certificate | None) -> str:
    what = "IP address" if is_ip_address(host) else "host name"
    if presented is None:
        listed = "`llmgw-cli cert show server.crt` on the control plane shows the names it has"
    else:
        dns_names, ip_addresses = alternative_names(presented)
        names = [f"DNS:{name}" for name in dns_names] + [f"IP:{ip}" for ip in ip_addresses]
        listed = f"it has {', '.join(names)}" if names else "it has none"
    return (
        f"the server certificate is not valid for {host}: that {what} is not among its "
        f"subject alternative names ({listed}). Reissue it where the llmgw CA is kept, "
        "with every host and IP that agents and operators dial, install it on the control "
        f"plane and restart llmgw-server: `{_reissue_command(host, presented)}`"
    )


def _explain_refusal(error: ssl.SSLError, host: str) -> str:
    reason = error.reason or ""
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return (
            f"{host} requires a client certificate and none was sent: configure the "
            f"certificate and key issued with {_CLIENT_CERTIFICATE_COMMANDS}"
        )
    if reason == "SSLV3_ALERT_HANDSHAKE_FAILURE":
        return (
            f"{host} ended the handshake, most often because it requires a client certificate "
            f"and none was sent: configure the certificate and key issued with "
            f"{_CLIENT_CERTIFICATE_COMMANDS}"
        )
    if reason == "TLSV1_ALERT_UNKNOWN_CA":
        return (
            f"{host} does not trust the CA that issued this side's client certificate: "
            f"issue it from the control plane's CA with {_CLIENT_CERTIFICATE_COMMANDS}"
        )
    if reason == "SSLV3_ALERT_CERTIFICATE_EXPIRED":
        return (
            f"{host} refused this side's client certificate because it has expired: "
            f"issue a new one with {_CLIENT_CERTIFICATE_COMMANDS} and --force"
        )
    if reason == "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE":
        return (
            f"{host} refused this side's client certificate: it is not issued for client "
            f"authentication (clientAuth). Use one issued with {_CLIENT_CERTIFICATE_COMMANDS}"
        )
    if reason == "WRONG_VERSION_NUMBER":
        return f"{host} did not answer with TLS: check the port and that the server runs TLS"
    return f"TLS with {host} failed: {reason or error}"


def _reissue_command(host: str, presented: x509.Certificate | None) -> str:
    if presented is None:
        flag = address_flag(host)
        return f"llmgw-cli cert server {flag} {host} [--host/--ip for every other name] --force"
    dns_names, ip_addresses = alternative_names(presented)
    hosts, ips = list(dns_names), list(ip_addresses)
    if not is_ip_address(host) and host not in hosts:
        hosts.append(host)
    elif is_ip_address(host) and str(ipaddress.ip_address(host)) not in ips:
        ips.append(host)
    flags = [f"--host {name}" for name in hosts] + [f"--ip {ip}" for ip in ips]
    return f"llmgw-cli cert server {' '.join(flags)} --force"


def ssl_error_in(exc: BaseException) -> ssl.SSLError | None:
    """The SSLError itself or the one it was raised from, up a short chain."""
    current: BaseException | None = exc
    for _ in range(5):
        if current is None or isinstance(current, ssl.SSLError):
            return current
        current = current.__cause__ or current.__context__
    return None
