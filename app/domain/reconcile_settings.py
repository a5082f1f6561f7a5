"""The reconciler's settings: its timings and the leader's term, for ``reconcile.decide``."""

from __future__ import annotations

from datetime import datetime

import msgspec

from app.domain.adoption_grace import (
    DEFAULT_ADOPTION_GRACE_MAX_S,
    DEFAULT_ADOPTION_GRACE_S,
    DEFAULT_ADOPTION_QUIET_S,
)

DEFAULT_LOST_TIMEOUT_S = 60.0
DEFAULT_STABILITY_WINDOW_S = 10.0
DEFAULT_DRAIN_IDLE_TIMEOUT_S = 60.0
"""The reconciler's timings, written once: ``llmgw-server serve``'s flags default to them."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    epoch: int
    started_at: datetime
    adoption_grace_s: float = DEFAULT_ADOPTION_GRACE_S
    """The least the adoption grace lasts, unless every node is back sooner."""
    adoption_quiet_s: float = DEFAULT_ADOPTION_QUIET_S
    """Past the least, the grace lasts until no agent arrived for this long."""
    adoption_grace_max_s: float = DEFAULT_ADOPTION_GRACE_MAX_S
    """The most the grace lasts, whatever the fleet does."""
    adoption_grace_ended: bool = False
    """The grace ended at an earlier pass: it never opens again in this term."""
    lost_timeout_s: float = DEFAULT_LOST_TIMEOUT_S
    stability_window_s: float = DEFAULT_STABILITY_WINDOW_S
    replica_drain_grace_s: float = 600.0
    stray_grace_s: float = 10.0
    quiesce_s: float = 2.0
    """How long a replica out of routing keeps running before its engines are told to stop,
    so gateways see it leave the routing table before it goes; less when every live gateway
    has said it routes by a table without it (``FleetView.routing_seen``)."""
    drain_idle_timeout_s: float = DEFAULT_DRAIN_IDLE_TIMEOUT_S
    """How long a replica out of routing waits for the requests gateways report in flight
    on it to finish; past this it is stopped anyway (its engines then get their stop
    grace), so a stuck request or a gateway that reports forever cannot keep it alive."""
