"""When `llmgw-cli cert node` issues a node's certificate: after the node's certificates
were last revoked, by the revocation's own time.

`cert revoke --node` voids every certificate of the node issued until the revocation,
which the server records by its own clock; a certificate's issue time is the clock of the
machine that issues it, in whole seconds (``app.domain.revocations``). On a machine whose
clock is behind the server's, a replacement issued right after the revocation would be
issued "before" it, and revoked with the certificates it replaces. So `cert node` asks the
admin API when the node's certificates were last revoked and issues no earlier than the
second after, whatever this machine's clock says; the certificate is backdated by the
usual clock-skew allowance from that time, so a peer whose clock is behind the server's
still takes it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from cli.client import ADMIN, AdminClient, AdminUnreachable
from cli.config import ConnectionFlags, resolve_settings
from cli.operator import call

LOOKUP_WITHIN_S = 3.0
"""The longest `cert node` waits for the admin API's answer: the question only refines
the issue time, and a CA kept on a machine of its own, where no server answers, should
not hold every issue for the usual request timeout."""


class _Revocation(msgspec.Struct, frozen=True, kw_only=True):
    serial: str | None = None
    node_id: str | None = None
    revoked_at: datetime


class _Revocations(msgspec.Struct, frozen=True, kw_only=True):
    revocations: list[_Revocation] = []


class RevocationUnknown(Exception):
    """The admin API did not answer when asked when the node's certificates were
    revoked."""


def node_revoked_at(node_id: str, connection: ConnectionFlags | None) -> datetime | None:
    """When every certificate of ``node_id`` issued until then was last revoked, by the
    server's clock; None when they never were. Raises ``ConfigError`` for a config file
    that cannot be used, ``RevocationUnknown`` when the admin API does not answer, and
    the ``ClientError`` of one that answers with a refusal (a token it does not know) or
    an error: a mistake to mend, as for any command, not a server to go without."""
    settings = resolve_settings(connection or ConnectionFlags())
    try:
        with AdminClient(
            settings, timeout_s=LOOKUP_WITHIN_S, answer_within_s=LOOKUP_WITHIN_S
        ) as client:
            known = call(client, _Revocations, "GET", f"{ADMIN}/certificates").value
    except AdminUnreachable as exc:
        raise RevocationUnknown(str(exc)) from exc
    node_wide = [
        r.revoked_at for r in known.revocations if r.node_id == node_id and r.serial is None
    ]
    return max(node_wide, default=None)


def issue_time(now: datetime, revoked_at: datetime | None) -> datetime:
    """``now``, or the first whole second after ``revoked_at`` when that is later: an
    issue time is kept in whole seconds, and one in the revocation's own second is
    covered by it."""
    if revoked_at is None:
        return now
    return max(now, revoked_at.replace(microsecond=0) + timedelta(seconds=1))
