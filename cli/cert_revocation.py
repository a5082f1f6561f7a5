"""`llmgw-cli cert revoke` and `cert list`: the certificates the CA issued, and revoking them.

Revoking goes through the admin API (it is an event in the log, and the agent hub acts on
it); listing joins the CA directory's record of what it issued with what the control plane
knows (what was revoked, which certificate each node last connected with), each side only
where it is available.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import msgspec
from cyclopts import Parameter

from app.pki.errors import InvalidRequest, PkiError
from app.pki.files import load_certificate
from app.pki.issued import IssuedCertificate, read_issued
from app.pki.model import CLOCK_SKEW
from app.pki.names import check_subject_name
from app.regular_file import not_a_directory
from cli.arguments import MAX_REASON_LENGTH, UsageError, filled, stripped_one_line_reason
from cli.cert import CA_DIR_ENV, CaDir, default_ca_dir
from cli.cert_ends import ca_warning, leaf_warning
from cli.client import ADMIN, AdminClient, AdminUnreachable, ClientError
from cli.config import ConfigError, ConnectionFlags, ConnectionSettings, resolve_settings
from cli.operator import Output, call, run_command
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Column,
    counted,
    print_error,
    print_json,
    print_table,
    say,
)


class RevocationView(msgspec.Struct, frozen=True, kw_only=True):
    serial: str | None = None
    node_id: str | None = None
    reason: str
    revoked_at: datetime
    revoked_by: str = ""


class RevocationChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when that serial was revoked already (nothing was recorded)."""
    revocation: RevocationView


class NodeCertificateView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    serial: str = ""
    connected: bool = False


class CertificatesView(msgspec.Struct, frozen=True, kw_only=True):
    revocations: list[RevocationView] = []
    nodes: list[NodeCertificateView] = []


COLUMNS = (
    Column("serial", key=True),
    Column("kind"),
    Column("name", key=True),
    Column("expires", drop=1),
    Column("state", wrap=True),
)


class ListedCertificate(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `cert list --output json`."""

    serial: str
    kind: str | None
    """None for a certificate the CA directory has no record of (seen by the server only)."""
    name: str
    not_after: datetime | None
    state: str
    """issued, expired, revoked, or connected / last used by its node."""
    revocation: RevocationView | None = None


def revoke_certificate(
    *,
    serial: Annotated[
        str | None,
        Parameter(
            converter=filled, help="The certificate's serial (`llmgw-cli cert show` prints it)."
        ),
    ] = None,
    node: Annotated[
        str | None,
        Parameter(
            converter=filled,
            help="Instead of --serial: every certificate issued to this node until now; one "
            "issued afterwards connects (it returns once one issued here would be: a second "
            "at most).",
        ),
    ] = None,
    reason: Annotated[
        str,
        Parameter(
            converter=stripped_one_line_reason,
            help="Why, for the log (who revoked it is recorded too): one line of at most "
            f"{MAX_REASON_LENGTH} characters.",
        ),
    ],
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Revoke a node certificate: the agent hub refuses it from now on and closes the
    connections that use it within a second. Recorded in the log with you as the actor.

    ```
    llmgw-cli cert revoke --serial 5f1c0a9e3b7d24c81e6f90a3b5d7c2e4f1a8b603 --reason "laptop stolen"
    llmgw-cli cert revoke --node gpu-07 --reason "machine rebuilt"; llmgw-cli cert node gpu-07
    ```
    """
    if (serial is None) == (node is None):
        print_error("cert revoke", "give --serial or --node (one of them)")
        return EXIT_USAGE
    if not reason.strip():
        print_error("cert revoke", "--reason must say why")
        return EXIT_USAGE
    if node is not None:
        try:
            check_subject_name("node id", node)
        except InvalidRequest as exc:
            print_error("cert revoke", f"--node: {exc}")
            return EXIT_USAGE
    if serial is not None:
        refusal = serial_refusal(serial, _issued_here())
        if refusal is not None:
            print_error("cert revoke", refusal)
            return EXIT_USAGE

    def revoke(client: AdminClient) -> int:
        body = {"serial": serial, "node_id": node, "reason": reason}
        reply = call(
            client, RevocationChange, "POST", f"{ADMIN}/certificates/revocations", body=body
        )
        revocation = reply.value.revocation
        if revocation.node_id is not None:
            # So that `cert node` run right after issues the replacement, not one more
            # certificate the revocation covers.
            time.sleep(replacement_wait_s(revocation.revoked_at, datetime.now(UTC)))
        if output == "json":
            print_json(reply.raw)
            return EXIT_OK
        what = _revoked_what(revocation)
        if reply.value.changed:
            say(f"Revoked {what}. The agent hub refuses it from now on.")
        else:
            say(
                f"{what.capitalize()} was already revoked by {revocation.revoked_by} at "
                f"{_when(revocation.revoked_at)}; nothing changed."
            )
        return EXIT_OK

    return run_command("cert revoke", connection, revoke)


def serial_refusal(serial: str, issued: Sequence[IssuedCertificate]) -> str | None:
    """Why ``--serial`` would revoke nothing the operator meant, by what this CA issued:
    the first digits of a serial it issued (a revocation matches one serial exactly, and
    the admin API knows only the serials that connected), or an operator or server
    certificate, which only the agent hub would refuse. None when it may be sent."""
    digits = serial.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        return None  # the admin API says what a serial is
    wanted = format(int(digits, 16), "x")
    exact = [c for c in issued if c.serial == wanted]
    if exact:
        if any(c.kind == "node" for c in exact):
            return None
        certificate = exact[0]
        article = "an" if certificate.kind[:1] in ("a", "e", "i", "o", "u") else "a"
        return (
            f"--serial {serial} is the {certificate.kind} certificate of "
            f"{certificate.common_name}: only node certificates are revoked (the agent hub "
            f"refuses them); {article} {certificate.kind} certificate stays valid until it "
            "expires, unless the CA is rotated (docs/certificates.md)"
        )
    started = [c for c in issued if c.serial.startswith(wanted)]
    if not started:
        return None
    named = "; ".join(
        f"the {c.kind} certificate of {c.common_name}, {c.serial}" for c in started[:3]
    )
    return (
        f"--serial {serial} is only the start of the serial of {named}: give the whole "
        "serial, as a revocation matches one certificate exactly"
    )


def _issued_here() -> tuple[IssuedCertificate, ...]:
    """What the CA directory of this machine recorded issuing; none where there is no
    readable one (a revocation is often sent from elsewhere than the CA)."""
    try:
        return read_issued(default_ca_dir()).certificates
    except (UsageError, PkiError):
        return ()


def replacement_wait_s(revoked_at: datetime, now: datetime) -> float:
    """How long from ``now`` until a certificate issued here is issued after a node's
    revocation at ``revoked_at``, so the hub takes it for the replacement: its issue time
    is written in whole seconds, and one issued in the revocation's own second counts as
    issued until it. Never more than a second: a clock further behind the server's is not
    waited for."""
    issued_after = revoked_at.replace(microsecond=0) + timedelta(seconds=1)
    return min(max((issued_after - now).total_seconds(), 0.0), 1.0)


def list_certificates(
    *,
    ca_dir: CaDir = None,
    offline: Annotated[
        bool, Parameter(negative=(), help="Do not ask the admin API; the CA directory alone.")
    ] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """The certificates this CA issued, with what the control plane knows of each:
    revoked (by whom, when, why), connected, or last used by its node. Without a config
    file the admin API is asked at its defaults; one that is there but unusable is bad
    usage (exit 2), as for any command that calls the admin API: mend it, or give
    --offline. A CA directory that is not there is bad usage too (exit 2), not an empty
    list. An admin API that does not answer leaves the CA directory alone listed
    (saying so on stderr); one that refuses the credentials, or answers with an error,
    fails the command (exit 1), as it fails any other.

    ```
    llmgw-cli cert list
    llmgw-cli cert list --offline --output json
    ```
    """
    try:
        directory = ca_dir or default_ca_dir()
        _check_there(directory, given=ca_dir is not None)
    except UsageError as exc:
        print_error("cert list", str(exc))
        return EXIT_USAGE
    settings: ConnectionSettings | None = None
    if not offline:
        try:
            settings = resolve_settings(connection or ConnectionFlags())
        except ConfigError as exc:
            # No config file at all is no error (the defaults apply); one that is there but
            # unusable is a mistake to mend, not a server to go without.
            print_error("cert list", f"{exc} (--offline lists the CA directory alone)")
            return EXIT_USAGE
    try:
        record = read_issued(directory)
    except PkiError as exc:
        print_error("cert list", str(exc))
        return EXIT_FAILED
    known: CertificatesView | None = None
    if settings is not None:
        try:
            known = _ask_server(settings)
        except AdminUnreachable as exc:
            print_error(
                "cert list", f"the admin API did not answer ({exc}); showing the CA directory alone"
            )
        except ClientError as exc:
            # It answered, and refused (a token it does not know, a certificate it does not
            # trust) or failed: a mistake to mend, as for any command that calls it, not a
            # server to go without (--offline goes without).
            print_error("cert list", f"{exc} (--offline lists the CA directory alone)")
            return EXIT_FAILED
    now = datetime.now(UTC)
    rows = listed(record.certificates, known, now)
    for warning in _end_warnings(directory, record.certificates, rows, now):
        print_error("cert list", warning)
    if record.unreadable_lines:
        print_error(
            "cert list",
            f"{record.unreadable_lines} unreadable line(s) in {directory / 'issued.jsonl'} skipped",
        )
    if output == "json":
        print_json(msgspec.json.encode(rows))
        return EXIT_OK
    title = f"{counted(len(rows), 'certificate')} ({directory})"
    print_table(COLUMNS, (_row(row) for row in rows), title=title, wide=output == "wide")
    return EXIT_OK


def _check_there(directory: Path, *, given: bool) -> None:
    """A ``UsageError`` naming where the directory came from when nothing is at
    ``directory`` (or only a symbolic link to nothing): listed, it would be an empty CA
    rather than a mistyped path. What stands there but is no directory fails the
    reading."""
    try:
        os.stat(directory)
    except FileNotFoundError:
        problem = not_a_directory(directory) or "no such directory"
        where = "--dir" if given else f"the CA directory (${CA_DIR_ENV} or the default)"
        raise UsageError(f"{where} {directory}: {problem}") from None
    except OSError:
        return


def listed(
    issued: tuple[IssuedCertificate, ...], known: CertificatesView | None, now: datetime
) -> list[ListedCertificate]:
    """Issued certificates with their state, then any the server saw that the CA directory
    did not record (issued elsewhere, or before it kept a record)."""
    revocations = known.revocations if known else []
    by_serial = {r.serial: r for r in revocations if r.serial}
    by_node = {r.node_id: r for r in revocations if r.node_id and not r.serial}
    last_used = {n.serial: n for n in known.nodes if n.serial} if known else {}
    rows: list[ListedCertificate] = []
    for certificate in issued:
        revocation = by_serial.get(certificate.serial)
        node_wide = by_node.get(certificate.common_name) if certificate.kind == "node" else None
        if revocation is None and node_wide is not None and _issued_before(certificate, node_wide):
            revocation = node_wide
        rows.append(
            ListedCertificate(
                serial=certificate.serial,
                kind=certificate.kind,
                name=certificate.common_name,
                not_after=certificate.not_after,
                state=_state(certificate, revocation, last_used, now, known is not None),
                revocation=revocation,
            )
        )
    recorded = {row.serial for row in rows}
    for serial, node in sorted(last_used.items()):
        if serial not in recorded:
            revocation = by_serial.get(serial)
            rows.append(
                ListedCertificate(
                    serial=serial,
                    kind=None,
                    name=node.node_id,
                    not_after=None,
                    state="revoked" if revocation else _use(node.connected),
                    revocation=revocation,
                )
            )
    return rows


def _end_warnings(
    directory: Path,
    issued: tuple[IssuedCertificate, ...],
    rows: list[ListedCertificate],
    now: datetime,
) -> list[str]:
    """The CA's end and the ends of the certificates in use, when near (``cli.cert_ends``)."""
    warnings: list[str] = []
    try:
        ca = load_certificate(directory / "ca.crt")
    except PkiError:
        ca = None  # no CA here (a copy of the record alone): nothing to say of it
    if ca is not None and (line := ca_warning(directory, ca.not_valid_after_utc, now)):
        warnings.append(line)
    revoked = {row.serial for row in rows if row.revocation is not None}
    if line := leaf_warning(issued, revoked, now):
        warnings.append(line)
    return warnings


def _issued_before(certificate: IssuedCertificate, revocation: RevocationView) -> bool:
    """As the hub decides: a certificate's issue time is its not_before plus the skew
    allowance the CA backdates it by."""
    return certificate.not_before + CLOCK_SKEW <= revocation.revoked_at


def _state(
    certificate: IssuedCertificate,
    revocation: RevocationView | None,
    last_used: dict[str, NodeCertificateView],
    now: datetime,
    asked: bool,
) -> str:
    if revocation is not None:
        return "revoked"
    if certificate.not_after < now:
        return "expired"
    node = last_used.get(certificate.serial)
    if node is not None:
        return _use(node.connected)
    return "issued" if asked else "issued (revocations unknown)"


def _use(connected: bool) -> str:
    return "connected" if connected else "last used by its node"


def _row(row: ListedCertificate) -> tuple[str, ...]:
    expires = f"{row.not_after:%Y-%m-%d}" if row.not_after else ""
    return (row.serial, row.kind or "?", row.name, expires, _state_text(row))


def _state_text(row: ListedCertificate) -> str:
    revocation = row.revocation
    if revocation is None:
        return row.state
    return f"revoked {_when(revocation.revoked_at)} by {revocation.revoked_by}: {revocation.reason}"


def _ask_server(settings: ConnectionSettings) -> CertificatesView:
    with AdminClient(settings) as client:
        return call(client, CertificatesView, "GET", f"{ADMIN}/certificates").value


def _revoked_what(revocation: RevocationView) -> str:
    if revocation.serial is not None:
        return f"certificate {revocation.serial}"
    return f"every certificate of node {revocation.node_id} issued until now"


def _when(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M}"
