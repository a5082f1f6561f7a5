"""Certificates for a cluster, issued with ``llmgw-cli cert`` as an operator issues them.

One directory holds the CA (``ca.crt``, ``ca.key``), the control plane's server
certificate and a certificate per node and per operator, each named as ``llmgw-cli cert``
names it (``server``, ``node-<id>``, ``operator-<name>``). ``issue_pki`` creates what is
missing and keeps what exists, so a dev state directory keeps its certificates from one run
to the next and a test session issues its CA once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devcluster.errors import CertificatesFailed
from devcluster.ports import LOOPBACK
from devcluster.processes import program, run

CERT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodeCredentials:
    """The files an agent presents and trusts: its node certificate and key, the CA."""

    certificate: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class ClusterPki:
    """The CA directory; node and operator certificates are issued the first time asked."""

    directory: Path
    days: int | None = None
    """Validity of the certificates issued from now on; None: ``llmgw-cli cert``'s own."""

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def server_certificate(self) -> Path:
        return self.directory / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    def node(self, node_id: str) -> NodeCredentials:
        """The node's certificate, issued with ``llmgw-cli cert node`` the first time."""
        if not self.certificate(f"node-{node_id}").exists():
            self._cert("node", node_id)
        return self._node_files(node_id)

    def reissue(self, node_id: str) -> NodeCredentials:
        """A new certificate for the node, replacing its files (after a revocation, say)."""
        self._cert("node", node_id, "--force")
        return self._node_files(node_id)

    def operator(self, name: str) -> tuple[Path, Path]:
        """The operator's certificate and key, issued the first time."""
        stem = f"operator-{name}"
        if not self.certificate(stem).exists():
            self._cert("operator", name)
        return self.certificate(stem), self.key(stem)

    def certificate(self, stem: str) -> Path:
        return self.directory / f"{stem}.crt"

    def key(self, stem: str) -> Path:
        return self.directory / f"{stem}.key"

    def _node_files(self, node_id: str) -> NodeCredentials:
        stem = f"node-{node_id}"
        return NodeCredentials(self.certificate(stem), self.key(stem), self.ca)

    def _cert(self, *args: str) -> None:
        days = () if self.days is None else ("--days", str(self.days))
        cert(*args, "--dir", str(self.directory), *days)


def issue_pki(
    directory: Path,
    *,
    ca_name: str = "llmgw CA",
    nodes: Iterable[str] = (),
    operators: Iterable[str] = (),
    server_hosts: Iterable[str] = (),
    days: int | None = None,
) -> ClusterPki:
    """The CA and a server certificate for 127.0.0.1 (and ``server_hosts``) unless
    ``directory`` has them, and the certificates of ``nodes`` and ``operators`` now rather
    than when first asked for."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = ClusterPki(directory, days)
    if not pki.ca.exists():
        cert("init-ca", "--name", ca_name, "--dir", str(directory))
    if not pki.server_certificate.exists():
        hosts = [flag for host in server_hosts for flag in ("--host", host)]
        days_flags = () if days is None else ("--days", str(days))
        cert("server", "--ip", LOOPBACK, *hosts, "--dir", str(directory), *days_flags)
    for node in nodes:
        pki.node(node)
    for name in operators:
        pki.operator(name)
    return pki


def cert(*args: str) -> None:
    """``llmgw-cli cert ARGS``; ``CertificatesFailed`` with its output when it fails."""
    argv = [program("llmgw-cli"), "cert", *args]
    done = run(argv, timeout_s=CERT_TIMEOUT_S)
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()
        raise CertificatesFailed(f"llmgw-cli cert {' '.join(args[:2])} failed: {output}")
