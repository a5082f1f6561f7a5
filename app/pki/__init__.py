"""llmgw's private CA: ECDSA P-256 certificates for the agent channel and the admin API.

Pure building (`builders`, `describe`, `explain`) takes keys and the clock as
arguments; `files` and `tls` are the edges that touch the disk and sockets. The
exception tree is drawn in `app.pki.errors`.
"""

from app.pki.builders import build_ca, issue, issue_node, issue_operator, issue_server
from app.pki.describe import CertificateDescription, describe, kind_of
from app.pki.errors import (
    CaNotFound,
    CertificateFileError,
    CertificateNotYetValid,
    CertificateRejected,
    InvalidRequest,
    PkiError,
    RefusedOverwrite,
    TlsConfigurationError,
    UnprotectedKey,
    UnreadableFile,
)
from app.pki.explain import (
    explain_node_certificate_refusal,
    explain_tls_failure,
    ssl_error_in,
)
from app.pki.keys import generate_key
from app.pki.model import CertificateAuthority, CertificateKind, Usage, Validity
from app.pki.tls import (
    PeerIdentity,
    client_ssl_context,
    fetch_presented_certificate,
    peer_identity,
    server_ssl_context,
)

__all__ = [
    "CaNotFound",
    "CertificateAuthority",
    "CertificateDescription",
    "CertificateFileError",
    "CertificateKind",
    "CertificateNotYetValid",
    "CertificateRejected",
    "InvalidRequest",
    "PeerIdentity",
    "PkiError",
    "RefusedOverwrite",
    "TlsConfigurationError",
    "UnprotectedKey",
    "UnreadableFile",
    "Usage",
    "Validity",
    "build_ca",
    "client_ssl_context",
    "describe",
    "explain_node_certificate_refusal",
    "explain_tls_failure",
    "fetch_presented_certificate",
    "generate_key",
    "issue",
    "issue_node",
    "issue_operator",
    "issue_server",
    "kind_of",
    "peer_identity",
    "server_ssl_context",
    "ssl_error_in",
]
