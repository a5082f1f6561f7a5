"""The hub's refusals: which connections are refused before their session, and how often a
refusal is recorded.

A connection past its TLS handshake is given a session (``Admission.admit``) only if its
certificate is a node's and not revoked, its node is not cut off for flooding
(``CoolDown``) and has a connection left in its ``ConnectBudget``
(``app.hub.reconnects``). A refused one is closed and logged: a certificate that is not a
node's, or a revoked one, with 1008, recorded under the common name it carries; a node cut
off, with 1008, recorded; a node connecting too often, with 4004 (retry later), logged once
a minute and not recorded at all. A hello for a node whose connection still answers a ping
(two agents with one certificate) is refused in the same way, with 4005, and counted
(``connected_elsewhere``): recorded, each refusal would also have the other agent's
replicas placed anew.

Every refused connection is logged, but a refusal recorded as an event for each attempt
would let one stolen certificate, dialling in a loop, grow the log without end. The first
refusal for a key (a certificate and what it claimed) is recorded; later ones within
``interval_s`` are counted, and the count goes with the next one recorded
(``suppressed``). A certificate that claims a new name at every attempt gets at most
``per_group`` recorded a minute all told. Keys are bounded too: past ``max_keys`` the
longest-quiet one is forgotten, so a flood of names cannot exhaust memory. Each key's window
is the one every throttled warning uses (``app.domain.log_throttle``); each group's bound
is the hub's own.
``RefusalThrottle`` and ``CoolDown`` are pure: ``now`` is monotonic seconds, passed in.
"""

from __future__ import annotations

import math
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from time import monotonic
from typing import Any, NamedTuple

import msgspec
import structlog
from cryptography import x509
from websockets.asyncio.server import ServerConnection

from app.domain.log_throttle import LogThrottle
from app.domain.reports import AgentReport
from app.domain.revocations import PresentedCertificate
from app.hub.connection import AgentConnection
from app.hub.edge import report_of
from app.hub.reconnects import ConnectBudget, ConnectLimits
from app.hub.session import Close, ConnectionRefused, IdentityMismatch, PeerCertificate
from app.pki.describe import common_name, serial_hex
from app.pki.errors import CertificateRejected
from app.pki.model import CertificateKind
from app.pki.tls import PeerIdentity, peer_identity
from wire.messages import CloseCode, fit_close_reason

DEFAULT_INTERVAL_S = 60.0
DEFAULT_MAX_KEYS = 10_000
DEFAULT_PER_GROUP = 10
DEFAULT_COOL_DOWN_S = 60.0
log = structlog.get_logger(__name__)

RevocationCheck = Callable[[PresentedCertificate], str | None]
"""Why a certificate may no longer connect (it was revoked), or None when it may."""


class RefusalThrottle:
    """Which refusals to record: one a key an interval (``LogThrottle``), and of a group's
    keys, at most ``per_group`` an interval whatever keys it claims."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_keys: int = DEFAULT_MAX_KEYS,
        per_group: int = DEFAULT_PER_GROUP,
    ) -> None:
        self._interval_s = interval_s
        self._max_keys = max_keys
        self._per_group = per_group
        self._keys = LogThrottle(interval_s, max_keys)
        self._groups: OrderedDict[str, list[float]] = OrderedDict()

    def admit(self, key: str, now: float, group: str | None = None) -> int | None:
        """None: do not record this refusal (it is counted). Otherwise record it, with the
        number of refusals for ``key`` left unrecorded since the previous one. ``group``
        (the certificate) bounds how many different keys are recorded a minute."""
        if self._keys.holding(key, now):
            return None
        if group is not None and not self._group_admits(group, now):
            self._keys.hold(key)
            return None
        return self._keys.write(key, now)

    def _group_admits(self, group: str, now: float) -> bool:
        recent = [t for t in self._groups.get(group, []) if now - t < self._interval_s]
        admitted = len(recent) < self._per_group
        if admitted:
            recent.append(now)
        self._groups[group] = recent
        self._groups.move_to_end(group)
        _bound(self._groups, self._max_keys)
        return admitted


def _bound(entries: OrderedDict[str, Any], size: int) -> None:
    while len(entries) > size:
        entries.popitem(last=False)


class CoolDown:
    """Nodes cut off for flooding, refused for ``period_s`` afterwards. Without it a
    flooder that dials again at once would cost, per connection, a hello and two events
    (connected, disconnected); refused right after the handshake, it costs a handshake."""

    def __init__(
        self, period_s: float = DEFAULT_COOL_DOWN_S, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self._period_s = period_s
        self._max_keys = max_keys
        self._until: OrderedDict[str, float] = OrderedDict()

    def start(self, key: str, now: float) -> None:
        self._until[key] = now + self._period_s
        self._until.move_to_end(key)
        _bound(self._until, self._max_keys)

    def remaining_s(self, key: str, now: float) -> float | None:
        """Seconds ``key`` is still refused, or None when it may connect."""
        until = self._until.get(key)
        if until is None:
            return None
        if now >= until:
            del self._until[key]
            return None
        return until - now


class Admitted(NamedTuple):
    """A connection that may have a session: what its certificate says, for its session and
    for the revocations enforced while it lasts."""

    peer: PeerCertificate
    certificate: PresentedCertificate
    expires_at: datetime | None


class Admission:
    """The hub's checks of a connection before its session, and the record of refusals."""

    def __init__(
        self,
        record: Callable[[AgentReport], Awaitable[None]],
        *,
        revocations: RevocationCheck | None = None,
        refusals: RefusalThrottle | None = None,
        cool_down: CoolDown | None = None,
        connects: ConnectLimits | None = None,
    ) -> None:
        """``record``: hands a refusal to the service that records it."""
        self._record = record
        self.revoked: RevocationCheck = revocations or (lambda _: None)
        self._refusals = refusals or RefusalThrottle()
        self._cool_down = cool_down or CoolDown()
        self._connects = ConnectBudget(connects)
        self._too_often_lines = LogThrottle(DEFAULT_INTERVAL_S, DEFAULT_MAX_KEYS)
        """When a refusal for connecting too often was last logged, per node."""
        self._elsewhere_lines = LogThrottle(DEFAULT_INTERVAL_S, DEFAULT_MAX_KEYS)
        """When a refusal for a node connected elsewhere was last logged, per node."""
        self.connected_elsewhere = 0
        """Hellos refused since the hub was made: their node's connection still answered."""

    async def admit(self, websocket: ServerConnection, remote: str) -> Admitted | None:
        """Whose the connection is, or None when it was refused (closed, and said why)."""
        ssl_object = websocket.transport.get_extra_info("ssl_object")
        try:
            identity = _node_identity(ssl_object)
        except CertificateRejected as exc:
            await self._refuse(websocket, ssl_object, remote, str(exc))
            return None
        certificate = PresentedCertificate(
            common_name=identity.common_name,
            serial=identity.serial,
            issued_at=identity.issued_at,
        )
        revoked = self.revoked(certificate)
        if revoked is not None:
            await self._refuse(websocket, ssl_object, remote, revoked)
            return None
        cooling = self._cool_down.remaining_s(identity.common_name, monotonic())
        if cooling is not None:
            reason = f"cut off for sending too much; refused for another {cooling:.0f}s"
            await websocket.close(CloseCode.POLICY_VIOLATION, reason)
            refusal = ConnectionRefused(
                node_id=identity.common_name,
                remote_address=remote,
                certificate_serial=identity.serial,
                reason=reason,
            )
            await self.record(refusal)
            return None
        wait_s = self._connects.spend(identity.common_name, monotonic())
        if wait_s:
            await self._refuse_too_often(websocket, identity.common_name, wait_s)
            return None
        peer = PeerCertificate(
            common_name=identity.common_name,
            subject=identity.subject,
            kind=str(identity.kind),
            serial=identity.serial,
            dns_names=identity.dns_names,
            ip_addresses=identity.ip_addresses,
        )
        return Admitted(peer, certificate, identity.expires_at)

    def cut_off(self, node_id: str) -> None:
        """Refuse ``node_id`` for a while: its connection was cut off for sending too much."""
        self._cool_down.start(node_id, monotonic())

    async def record(self, refusal: IdentityMismatch | ConnectionRefused) -> None:
        """Hand a refusal to the service unless one for the same certificate (or node) was
        recorded within the throttle's interval; the ones left out are counted."""
        if isinstance(refusal, IdentityMismatch):
            node_id = refusal.claimed_node_id
        else:
            node_id = refusal.node_id
        certificate = refusal.certificate_serial or f"node:{node_id}"
        key = f"{certificate} {type(refusal).__name__} {node_id}"
        suppressed = self._refusals.admit(key, monotonic(), group=certificate)
        if suppressed is None:
            log.info("agent_refusal_suppressed", node_id=node_id, key=key)
            return
        await self._record(report_of(msgspec.structs.replace(refusal, suppressed=suppressed)))

    async def live_elsewhere(self, refused: AgentConnection, live: AgentConnection | None) -> bool:
        """Whether ``live``, the current connection of the node ``refused`` said hello for,
        still answers a ping; then ``refused`` is closed, with 4005, which its agent retries
        at its slowest pace. Not an event, and the node not reported connected: the log
        would grow by one a try, and every try would have the live agent's replicas placed
        anew. One log line a minute a node. One that does not answer (half-open: its agent
        restarted) is left to be replaced."""
        if live is None or live is refused or not await live.answers_ping():
            return False
        node_id = refused.session.node_id
        for output in refused.session.connected_elsewhere(live.session.remote_address):
            if isinstance(output, Close):
                refused.close(output.code, output.reason)
                self.connected_elsewhere += 1
                unlogged = self._elsewhere_lines.admit(node_id or "", monotonic())
                if unlogged is not None:
                    log.warning(
                        "agent_connected_elsewhere",
                        node_id=node_id,
                        live_remote_address=live.session.remote_address,
                        reason=output.reason,
                        refused_unlogged=unlogged,
                    )
        return True

    async def _refuse_too_often(
        self, websocket: ServerConnection, node_id: str, wait_s: float
    ) -> None:
        """Close a connection of a node over its connect budget, before its hello: with
        4004, which its agent retries at its slowest pace. Not an event: a node in a loop
        would grow the log by one a refusal. One log line a minute, with the count left out."""
        limits = self._connects.limits.describe()
        reason = f"connecting too often: {limits}; retry in {math.ceil(wait_s)}s"
        await websocket.close(CloseCode.TOO_OFTEN, reason)
        unlogged = self._too_often_lines.admit(node_id, monotonic())
        if unlogged is not None:
            log.warning(
                "agent_connection_too_often",
                node_id=node_id,
                reason=reason,
                refused_unlogged=unlogged,
            )

    async def _refuse(
        self, websocket: ServerConnection, ssl_object: object, remote: str, reason: str
    ) -> None:
        """Close a connection whose certificate is not a node's, and record the attempt
        under the common name it carries (it has claimed no node yet)."""
        log.warning("agent_connection_refused", reason=reason)
        await websocket.close(CloseCode.POLICY_VIOLATION, fit_close_reason(reason))
        presented = _presented_certificate(ssl_object)
        if presented is None:
            return
        name = common_name(presented)
        if not name:
            return
        rejection = IdentityMismatch(
            claimed_node_id=name,
            certificate_subject=presented.subject.rfc4514_string(),
            remote_address=remote,
            reason=reason,
            certificate_serial=serial_hex(presented),
        )
        try:
            await self.record(rejection)
        except Exception:
            log.exception("agent_refusal_not_recorded")


def _node_identity(ssl_object: object) -> PeerIdentity:
    if not isinstance(ssl_object, ssl.SSLObject):
        raise CertificateRejected("the connection is not protected by TLS")
    return peer_identity(ssl_object, expect=CertificateKind.NODE)


def _presented_certificate(ssl_object: object) -> x509.Certificate | None:
    if not isinstance(ssl_object, ssl.SSLObject):
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    try:
        return x509.load_der_x509_certificate(der)
    except ValueError:
        return None
