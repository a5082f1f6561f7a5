"""`llmgw-cli cert ...`: llmgw's private CA, kept in a directory on the operator's machine.

Exit codes: 0 done, 1 failed (no CA, a file in the way, an unreadable file), 2 bad usage.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from cryptography import x509
from cyclopts import App, Parameter

from app.pki.builders import build_ca, issue_node, issue_operator, issue_server
from app.pki.describe import CertificateDescription, describe
from app.pki.errors import CaNotFound, InvalidRequest, PkiError
from app.pki.files import IssuedFiles, load_ca, load_certificate, write_ca, write_issued
from app.pki.issued import record_issued
from app.pki.keys import PrivateKey, generate_key
from app.pki.model import MAX_DAYS, CertificateAuthority
from app.pki.names import check_host, check_subject_name, parse_ip
from cli.arguments import UsageError, filled_path, whole_number
from cli.cert_replacement import RevocationUnknown, issue_time, node_revoked_at
from cli.client import ClientError
from cli.config import ConfigError, ConnectionFlags
from cli.render import print_error, print_json, say

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
CA_DIR_ENV = "LLMGW_CA_DIR"

cert_app = App(
    name="cert",
    help="""Run llmgw's private CA: create it, issue server, node and operator certificates,
show what a certificate contains, list what it issued and revoke node certificates.

```
llmgw-cli cert init-ca --dir ./ca
llmgw-cli cert node gpu-07 --dir ./ca --ip 10.20.0.7
llmgw-cli cert revoke --node gpu-07 --reason "machine retired"
```
""",
)

CaDir = Annotated[
    Path | None,
    Parameter(
        name="--dir",
        converter=filled_path,
        help="CA directory (ca.crt, ca.key). "
        "[default: $LLMGW_CA_DIR (refused if empty), else $XDG_DATA_HOME/llmgw/ca, else "
        "~/.local/share/llmgw/ca]",
    ),
]
OutDir = Annotated[
    Path | None,
    Parameter(
        name="--out",
        converter=filled_path,
        help="Where to write the certificate and key. [default: --dir]",
    ),
]
IssuedDays = Annotated[
    int,
    Parameter(
        help="Days the certificate is valid; never past the CA's own expiry.",
        converter=whole_number,
    ),
]
Force = Annotated[bool, Parameter(name="--force", negative=(), help="Replace existing files.")]
Output = Annotated[
    Literal["text", "json"],
    Parameter(help="text for people; json prints the files written and what the certificate says."),
]


class WrittenCertificate(msgspec.Struct, frozen=True, kw_only=True):
    """What ``--output json`` prints after a certificate is written."""

    certificate: str
    """Absolute paths, whatever directory the command ran in."""
    key: str
    description: CertificateDescription


def _repeated(flag: str, help: str) -> Parameter:
    """A flag given once per value (``--ip A --ip B``), with no ``--empty-`` form."""
    return Parameter(name=flag, negative_iterable=(), help=help)


IssueCertificate = Callable[[CertificateAuthority, PrivateKey, datetime], x509.Certificate]


@cert_app.command(name="init-ca")
def init_ca(
    *,
    ca_dir: CaDir = None,
    name: Annotated[str, Parameter(help="Common name of the CA.")] = "llmgw CA",
    days: Annotated[
        int, Parameter(help="Days the CA is valid (at most 10000).", converter=whole_number)
    ] = 3650,
    force: Force = False,
    output: Output = "text",
) -> int:
    """Create the CA: a new key (ca.key, mode 0600) and a self-signed root (ca.crt).

    Keep ca.key on the machine that issues certificates only; servers and agents need
    ca.crt alone. Refuses to replace an existing CA unless --force is given.

    ```
    llmgw-cli cert init-ca --dir /etc/llmgw/ca --name "llmgw CA (prod)"
    llmgw-cli cert init-ca --dir ./ca --output json | jq -r .description.sha256_fingerprint
    ```
    """

    def create() -> int:
        directory = ca_dir or default_ca_dir()
        _check_days(days)
        ca = build_ca(generate_key(), name, _now(), days)
        files = write_ca(directory, ca, force=force)
        description = describe(ca.certificate, _now())
        if output == "json":
            _print_written(files.certificate, files.key, description)
            return EXIT_OK
        say(f"Created the CA in {directory}")
        say(f"  certificate  {files.certificate}  (give it to servers and agents)")
        say(f"  key          {files.key}  (mode 0600; keep it here, never copy it)")
        _print_description(description)
        return EXIT_OK

    return _run("init-ca", create)


@cert_app.command(name="server")
def server_certificate(
    *,
    host: Annotated[
        tuple[str, ...], _repeated("--host", "A host name clients dial; repeat for each.")
    ] = (),
    ip: Annotated[tuple[str, ...], _repeated("--ip", "An IP clients dial; repeat for each.")] = (),
    ca_dir: CaDir = None,
    out: OutDir = None,
    days: IssuedDays = 825,
    force: Force = False,
    output: Output = "text",
) -> int:
    """Issue the control plane's server certificate (server.crt, server.key).

    Clients check the address they dial against the certificate's names and nothing
    else, so name every host and every IP that agents and operators dial.

    ```
    llmgw-cli cert server --host llmgw.internal --ip 10.0.0.5 --ip 127.0.0.1
    ```
    """

    def create() -> int:
        directory = ca_dir or default_ca_dir()
        hosts = [check_host(name) for name in host]
        ips = [parse_ip(address) for address in ip]
        if not hosts and not ips:
            raise InvalidRequest("name at least one --host or --ip that clients dial")
        _check_days(days)

        def build(ca: CertificateAuthority, key: PrivateKey, now: datetime) -> x509.Certificate:
            return issue_server(ca, key, hosts, ips, now, days)

        return _issue(directory, out, "server", "server", force, build, output)

    return _run("server", create)


@cert_app.command(name="node")
def node_certificate(
    node_id: Annotated[str, Parameter(help="The node id the agent will claim.")],
    /,
    *,
    host: Annotated[
        tuple[str, ...],
        _repeated(
            "--host", "A host name at which the node's engines are reachable; repeat for each."
        ),
    ] = (),
    ip: Annotated[
        tuple[str, ...],
        _repeated("--ip", "An IP at which the node's engines are reachable; repeat for each."),
    ] = (),
    ca_dir: CaDir = None,
    out: OutDir = None,
    days: IssuedDays = 365,
    force: Force = False,
    output: Output = "text",
    offline: Annotated[
        bool,
        Parameter(
            negative=(),
            help="Do not ask the admin API when the node's certificates were last revoked; "
            "issue by this machine's clock alone.",
        ),
    ] = False,
    connection: ConnectionFlags | None = None,
) -> int:
    """Issue an agent's client certificate (`node-<id>.crt`, `node-<id>.key`).

    Its common name is the node id: with require_identity on, the agent hub refuses an
    agent that claims any other id. The address an agent advertises for its engines
    (`llmgw-agent --address`) must be one the certificate names with --host or --ip, or
    the address its connection to the control plane comes from.

    When the node's certificates were revoked (`cert revoke --node`), it is issued after
    the revocation by the server's clock, whatever this machine's clock says, so it
    connects as their replacement: the admin API is asked when (a note says so when it
    does not answer, and the certificate is issued by this machine's clock).

    ```
    llmgw-cli cert node gpu-07 --out ./gpu-07
    llmgw-cli cert node gpu-07 --host gpu-07.internal --ip 10.20.0.7
    llmgw-cli cert node gpu-08 --output json | jq -r .description.serial
    ```
    """

    def create() -> int:
        directory = ca_dir or default_ca_dir()
        check_subject_name("node id", node_id)
        hosts = [check_host(name) for name in host]
        ips = [parse_ip(address) for address in ip]
        _check_days(days)

        def build(ca: CertificateAuthority, key: PrivateKey, now: datetime) -> x509.Certificate:
            revoked_at = None if offline else _node_revoked_at(node_id, connection)
            issued_at = issue_time(now, revoked_at)
            return issue_node(ca, key, node_id, issued_at, days, hosts=hosts, ips=ips)

        return _issue(directory, out, f"node-{node_id}", f"node {node_id}", force, build, output)

    return _run("node", create)


def _node_revoked_at(node_id: str, connection: ConnectionFlags | None) -> datetime | None:
    try:
        return node_revoked_at(node_id, connection)
    except ConfigError as exc:
        raise UsageError(f"{exc} (--offline issues without asking the admin API)") from exc
    except RevocationUnknown as exc:
        _error(
            "node",
            f"the admin API did not say when node {node_id}'s certificates were last revoked "
            f"({exc}); issued by this machine's clock (--offline: do not ask)",
        )
        return None


@cert_app.command(name="operator")
def operator_certificate(
    name: Annotated[str, Parameter(help="Who the certificate is for.")],
    /,
    *,
    ca_dir: CaDir = None,
    out: OutDir = None,
    days: IssuedDays = 365,
    force: Force = False,
    output: Output = "text",
) -> int:
    """Issue an operator's client certificate for the admin API (`operator-<name>.crt`).

    ```
    llmgw-cli cert operator alice --out ~/.config/llmgw
    llmgw-cli cert operator bob --output json | jq -r .certificate
    ```
    """

    def create() -> int:
        directory = ca_dir or default_ca_dir()
        check_subject_name("operator name", name)
        _check_days(days)

        def build(ca: CertificateAuthority, key: PrivateKey, now: datetime) -> x509.Certificate:
            return issue_operator(ca, key, name, now, days)

        return _issue(directory, out, f"operator-{name}", f"operator {name}", force, build, output)

    return _run("operator", create)


@cert_app.command(name="show")
def show_certificate(
    file: Annotated[
        Path,
        Parameter(
            converter=filled_path,
            help="A certificate file (PEM or DER): a regular file, 512 KiB at most.",
        ),
    ],
    /,
    *,
    output: Annotated[Literal["text", "json"], Parameter(help="text for people, json.")] = "text",
) -> int:
    """Show what a certificate says: kind, names, usages, validity, issuer, fingerprint.

    ```
    llmgw-cli cert show server.crt
    llmgw-cli cert show node-gpu-07.crt --output json
    ```
    """

    def render() -> int:
        description = describe(load_certificate(file), _now())
        if output == "json":
            print_json(msgspec.json.encode(description))
        else:
            say(f"{file}: {description.kind} certificate")
            _print_description(description)
        return EXIT_OK

    return _run("show", render)


def default_ca_dir() -> Path:
    """``$LLMGW_CA_DIR``, else ``$XDG_DATA_HOME/llmgw/ca``. ``$LLMGW_CA_DIR`` set empty is a
    ``UsageError``, as any setting given empty is (cli.config): taken for unset, the CA
    would be read or created somewhere the operator did not name. An empty
    ``$XDG_DATA_HOME`` is unset, as the XDG Base Directory specification says."""
    explicit = os.environ.get(CA_DIR_ENV)
    if explicit is not None:
        if not explicit.strip():
            raise UsageError(f"${CA_DIR_ENV} is empty: give the CA directory, or unset it")
        return Path(explicit)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "llmgw" / "ca"


def _issue(
    ca_dir: Path,
    out: Path | None,
    stem: str,
    what: str,
    force: bool,
    build: IssueCertificate,
    output: Literal["text", "json"],
) -> int:
    ca = load_ca(ca_dir)
    now = _now()
    if now > ca.certificate.not_valid_after_utc:
        _error(
            what.split()[0],
            f"the CA in {ca_dir} expired on {_when(ca.certificate.not_valid_after_utc)}",
        )
        return EXIT_FAILED
    key = generate_key()
    certificate = build(ca, key, now)
    files = write_issued(out or ca_dir, stem, certificate, key, force=force)
    record_issued(ca_dir, certificate, files.certificate)
    description = describe(certificate, now)
    if output == "json":
        _print_written(files.certificate, files.key, description)
    else:
        _print_issued(what, files, description)
    return EXIT_OK


def _run(name: str, command: Callable[[], int]) -> int:
    """``command``'s exit code, or 1 or 2 with its error told as ``cert NAME``'s."""
    try:
        return command()
    except (UsageError, InvalidRequest) as exc:
        _error(name, str(exc))
        return EXIT_USAGE
    except CaNotFound as exc:
        _error(name, f"{exc}: run `llmgw-cli cert init-ca --dir {exc.ca_dir}` first")
        return EXIT_FAILED
    except ClientError as exc:  # the admin API, asked by `cert node`, refused or failed
        _error(name, f"{exc}; nothing was issued (--offline issues without asking it)")
        return EXIT_FAILED
    except PkiError as exc:
        _error(name, str(exc))
        return EXIT_FAILED


def _check_days(days: int) -> None:
    if not 1 <= days <= MAX_DAYS:
        raise InvalidRequest(
            f"--days must be between 1 and {MAX_DAYS} (about 27 years), not {days}"
        )


def _print_written(certificate: Path, key: Path, description: CertificateDescription) -> None:
    written = WrittenCertificate(
        certificate=str(certificate.resolve()), key=str(key.resolve()), description=description
    )
    print_json(msgspec.json.encode(written))


def _print_issued(what: str, files: IssuedFiles, description: CertificateDescription) -> None:
    say(f"Issued the {what} certificate")
    say(f"  certificate  {files.certificate}")
    say(f"  key          {files.key}  (mode 0600; copy it only to where it is used)")
    _print_description(description)


def _print_description(description: CertificateDescription) -> None:
    rows: list[tuple[str, str]] = [
        ("kind", str(description.kind)),
        ("subject", description.subject),
        ("issuer", description.issuer + ("  (self-signed)" if description.self_signed else "")),
        ("host names", _words(description.dns_names)),
        ("IP addresses", _words(description.ip_addresses)),
        ("key usages", _words(description.key_usages)),
        ("used for", _words(description.extended_key_usages)),
        ("valid from", _when(description.not_before)),
        ("valid until", _when(description.not_after) + _validity_note(description)),
        ("public key", description.public_key),
        ("serial", description.serial),
        ("SHA-256", description.sha256_fingerprint),
    ]
    for label, value in rows:
        say(f"  {label:<13}{value}")


def _validity_note(description: CertificateDescription) -> str:
    if description.expired:
        return "  (EXPIRED)"
    if description.not_yet_valid:
        return "  (NOT VALID YET)"
    days_left = (description.not_after - _now()).days
    return f"  ({days_left} days from now)"


def _words(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "none"


def _when(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _now() -> datetime:
    return datetime.now(UTC)


def _error(name: str, message: str) -> None:
    """``llmgw-cli cert NAME: MESSAGE`` on stderr, naming the command typed, as every
    command's errors do."""
    print_error(f"cert {name}", message)


# The admin API's certificates and revocations (``cli.cert_revocation``, which reads the CA
# directory as these do), imported when one of them runs.
cert_app.command("cli.cert_revocation:revoke_certificate", name="revoke")
cert_app.command("cli.cert_revocation:list_certificates", name="list")
