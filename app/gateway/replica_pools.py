"""The replicas a request is chosen from: a model's pool, or in a rollout's canary step
the two sides of its split (``CanarySplit``), and why a request went where it did
(``RouteReason``). They are built when the router takes a snapshot
(``app.gateway.replica_choice``)."""

from __future__ import annotations

from typing import Literal

from app.domain.rendezvous import Rendezvous
from app.gateway.admission import ReplicaState
from app.gateway.table import Canary

RouteReason = Literal["least_loaded", "no_key", "home", "over_bound", "unavailable", "fallback"]
"""Why a request went where it did: ``least_loaded`` (the policy's rule); for ``prefix`` and
``session``: ``home`` (its key's own replica), ``over_bound`` (replicas before it on the
key's walk were above their bound), ``unavailable`` (the first one passed over was
saturated, or had just failed this request), ``fallback`` (no replica on the walk could
take it: the
least-loaded one did, a draining one perhaps) or ``no_key`` (the request had no key: the
least-loaded one took it)."""


class Pool:
    """Replicas a request may go to (a model's, or one side of its canary split), and the
    rendezvous of those that are not draining (all of them if all are) when its policy
    hashes."""

    __slots__ = ("by_id", "rendezvous", "replicas")

    def __init__(self, replicas: list[ReplicaState]) -> None:
        self.replicas = replicas
        self.by_id = {s.route.replica_id: s for s in replicas}
        self.rendezvous: Rendezvous | None = None

    def keyed_members(self) -> tuple[tuple[str, float], ...]:
        routed = [s for s in self.replicas if not s.route.draining] or self.replicas
        return tuple(sorted((s.route.replica_id, s.route.weight) for s in routed))


Choice = tuple[ReplicaState, RouteReason] | None
KEYED_REASONS: dict[str, RouteReason] = {
    "home": "home",
    "over_bound": "over_bound",
    "refused": "unavailable",
}


class CanarySplit:
    """A model's replicas in a canary step: ``canary`` (those of the canary revision) take
    ``share`` of its requests, ``stable`` (the others) the rest."""

    __slots__ = ("canary", "share", "stable")

    def __init__(self, share: float, canary: Pool, stable: Pool) -> None:
        self.share = share
        self.canary = canary
        self.stable = stable


def canary_split(canary: Canary | None, replicas: list[ReplicaState]) -> CanarySplit | None:
    """The canary split of a model in a canary step whose replicas are on both sides: with
    one side empty every request ends on the other anyway, as without a split."""
    if canary is None:
        return None
    on_canary = [s for s in replicas if s.route.revision == canary.revision]
    others = [s for s in replicas if s.route.revision != canary.revision]
    if on_canary and others:
        return CanarySplit(canary.share, Pool(on_canary), Pool(others))
    return None
