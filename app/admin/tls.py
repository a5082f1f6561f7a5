"""HTTPS for the admin listener, with the client certificate in every request's scope.

uvicorn does not tell an ASGI app who is on the other end of a TLS connection. The
protocol here does, as the ASGI TLS extension (``scope["extensions"]["tls"]``): the
verified client certificate as PEM in ``client_cert_chain`` (Python's ``ssl`` exposes the
leaf only), its subject in ``client_cert_name``. The handshake has already checked that
the certificate chains to the llmgw CA; whether it may act as an operator is for
``app.admin.auth`` to decide. The listener serves no WebSocket: an upgrade request is
answered as plain HTTP, without a warning in the log.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from pathlib import Path

from cryptography import x509
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.admin.bodies import MAX_BODY_BYTES
from app.admin.errors import problem_body
from app.listeners.limits import DEFAULT_KEEP_ALIVE_S, ListenerLimits, limited
from app.listeners.refusals import ListenerRefusals
from app.pki.tls import server_ssl_context

TLS_EXTENSION = "tls"
_TLS_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
"""``ssl.SSLObject.version()`` as the 16-bit code the ASGI TLS extension asks for."""

TlsExtension = dict[object, object]


def admin_ssl_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The admin listener's TLS: its server certificate, and client certificates optional
    (tokens and unauthenticated probes need none) but verified against the llmgw CA when
    sent. Raises ``TlsConfigurationError`` for unusable files."""
    return server_ssl_context(cert, key, ca, require_client_cert=False)


def tls_extension(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> TlsExtension:
    """The ASGI TLS extension of an established connection."""
    chain: list[str] = []
    name: str | None = None
    error: str | None = None
    if ssl_object.context.verify_mode == ssl.CERT_NONE:
        # Unverified, a presented certificate proves nothing: report none.
        error = "this listener does not verify client certificates"
    elif der := ssl_object.getpeercert(binary_form=True):
        chain = [ssl.DER_cert_to_PEM_cert(der)]
        name = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    version = ssl_object.version()
    return {
        "server_cert": None,
        "client_cert_chain": chain,
        "client_cert_name": name,
        "client_cert_error": error,
        "tls_version": _TLS_VERSIONS.get(version) if version else None,
        "cipher_suite": None,
    }


class TlsScopeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, adding the TLS extension to each request's scope."""

    _tls: TlsExtension | None = None

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        # asyncio calls this once the handshake is complete: the certificate is final.
        ssl_object = transport.get_extra_info("ssl_object")
        self._tls = tls_extension(ssl_object) if ssl_object is not None else None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls is not None:
            self.scope["extensions"] = {TLS_EXTENSION: self._tls}

    def _unsupported_upgrade_warning(self) -> None:
        # The admin API serves no WebSocket (``ws="none"``): a handshake is answered as the
        # plain HTTP request it also is. uvicorn would log two warnings for each, one of
        # them telling the operator to install a WebSocket library: any client could fill
        # the log with them.
        return


DEFAULT_ADMIN_MAX_CONNECTIONS = 256
"""Operators, scripts, scrapers and event followers: a few dozen at once is a busy day."""
DEFAULT_ADMIN_KEEP_ALIVE_S = DEFAULT_KEEP_ALIVE_S
"""How long a kept-alive admin connection may sit idle between requests: uvicorn's own
keep-alive time, which the admin listener has always had. A client that keeps idle
connections longer (a load balancer's pool, a scraper) needs a longer one, so that it lets
go of a connection before the listener closes it under its next request."""


def admin_protocol(
    limits: ListenerLimits,
    refusals: ListenerRefusals | None = None,
    *,
    keep_alive_s: float = DEFAULT_ADMIN_KEEP_ALIVE_S,
) -> type[HttpToolsProtocol]:
    """The admin listener's protocol: the TLS extension in each scope, slow clients cut
    off (``app.listeners.limits``) with a problem document, and a body announced over the
    admin API's limit refused before the app (or a ``100 Continue``) is reached; each
    refusal counted and logged in ``refusals`` (for the admin API's ``/metrics``). A
    kept-alive connection idle for ``keep_alive_s`` between requests is closed."""
    return limited(
        TlsScopeProtocol,
        replace(limits, max_body_bytes=MAX_BODY_BYTES),
        problem_body,
        refusals,
        keep_alive_s=keep_alive_s,
    )
