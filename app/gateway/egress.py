"""The gateway's egress check: routes to engine addresses it may not contact are left out.

Every engine the gateway contacts, to forward a request or to scrape ``/metrics``, is a
route of the snapshot the router and the application are given, and every snapshot passes
through ``EngineEgress.admit`` first (``Gateway._use``): a route whose engine address is
outside the allowed engine networks never reaches them, so no socket is ever opened to it.

What is allowed is ``app.domain.egress``: the ``--engine-networks`` list when one is given,
else, per route, only the address its node's agent connected from. A route's address is
the host of its URL, which must be exactly ``http://<host>:<port>`` (as
``app.gateway.snapshot.engine_url`` renders it): anything else is refused too.

Each refused address is logged once (a warning naming the route and why); each refused
route is counted once in ``llmgw_gateway_engine_egress_refusals_total{reason}``, and
``llmgw_gateway_egress_refused_routes`` says how many routes the current snapshot lost.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import structlog

from app.domain.egress import EngineNetworks, connection_host
from app.gateway.metrics import GatewayMetrics
from app.gateway.table import GatewaySnapshot, Route

log = structlog.get_logger("llmgw.gateway")

MAX_WARNED_ADDRESSES = 10_000
"""Addresses remembered as already warned about (past that, refusals are only counted),
and agent addresses whose default networks are kept at once."""


class Refusal(NamedTuple):
    reason: str
    """The metric's label: ``outside_engine_networks``, ``not_the_agent_address`` or
    ``not_an_engine_url``."""
    explanation: str


def engine_host(url: str) -> str | None:
    """The host of ``http://<host>:<port>``, brackets kept around IPv6; None for any URL
    with more or less in it (user info, a path, a query, no port, another scheme). What
    the host may be is ``EngineNetworks.allows``'s to say: an IP address or a host name,
    so nothing of the URL is left for a parser to read another way."""
    if not url.startswith("http://"):
        return None
    host, colon, port = url[len("http://") :].rpartition(":")
    # ASCII digits only: str.isdigit() takes others too, "²" which int() refuses among them.
    if not colon or not host or not (port.isascii() and port.isdigit()):
        return None
    if not 0 < int(port) <= 65535:
        return None
    if host.startswith("["):
        return host if host.endswith("]") and "]" not in host[:-1] else None
    return None if ":" in host else host


class _ModelAdmitted(NamedTuple):
    """What ``EngineEgress.admit`` made of one model's routes: kept for as long as the
    snapshots give it the same tuple."""

    candidates: tuple[Route, ...]
    kept: tuple[Route, ...] | None
    """The routes admitted: ``candidates`` itself when all are; ``None`` when none is."""
    refused: frozenset[tuple[str, str]]
    """``(replica_id, url)`` of each route refused."""
    decisions: dict[tuple[str, str], Refusal | None]


class EngineEgress:
    def __init__(self, networks: EngineNetworks | None, metrics: GatewayMetrics) -> None:
        """``networks`` None: the default, each node's own agent connection address."""
        self.networks = networks
        self._metrics = metrics
        self._admitted: dict[str, _ModelAdmitted] = {}
        self._refused: set[tuple[str, str]] = set()
        self._warned: set[str] = set()
        self._agents: dict[str, EngineNetworks] = {}

    def admit(self, snapshot: GatewaySnapshot) -> GatewaySnapshot:
        """``snapshot`` without the routes whose engine may not be contacted. A model whose
        routes are the same tuple as in the snapshot before keeps what was made of them;
        only the others are judged, with the decisions kept for their routes still in it."""
        before = self._admitted
        admitted: dict[str, _ModelAdmitted] = {}
        refused_before = self._refused
        refused = set(refused_before)
        for model, candidates in snapshot.routes.items():
            kept = before.get(model)
            if kept is None or kept.candidates is not candidates:
                if kept is not None:
                    refused.difference_update(kept.refused)
                kept = self._admit(candidates, kept, refused_before)
                refused.update(kept.refused)
            admitted[model] = kept
        for model, gone in before.items():
            if model not in admitted:
                refused.difference_update(gone.refused)
        self._admitted = admitted
        self._refused = refused
        self._metrics.egress_refused_routes(len(refused))
        if not refused:
            return snapshot
        routes = {model: made.kept for model, made in admitted.items() if made.kept is not None}
        return msgspec.structs.replace(snapshot, routes=routes)

    def _admit(
        self,
        candidates: tuple[Route, ...],
        before: _ModelAdmitted | None,
        refused_before: set[tuple[str, str]],
    ) -> _ModelAdmitted:
        """Judge a model's routes, reusing ``before``'s decisions; a route refused that was
        not refused in the snapshot before is counted and warned about."""
        known = before.decisions if before is not None else {}
        decisions: dict[tuple[str, str], Refusal | None] = {}
        per_node = self.networks is None
        refused: set[tuple[str, str]] = set()
        kept = []
        for route in candidates:
            key = (route.url, route.agent_address if per_node else "")
            if key in decisions:
                refusal = decisions[key]
            else:
                refusal = decisions[key] = known[key] if key in known else self._judge(route)
            if refusal is None:
                kept.append(route)
                continue
            route_key = (route.replica_id, route.url)
            refused.add(route_key)
            if route_key not in refused_before:
                self._metrics.egress_refused(refusal.reason)
                self._warn(route, refusal)
        admitted = candidates if len(kept) == len(candidates) else tuple(kept) or None
        return _ModelAdmitted(candidates, admitted, frozenset(refused), decisions)

    def _judge(self, route: Route) -> Refusal | None:
        host = engine_host(route.url)
        if host is None:
            return Refusal("not_an_engine_url", f"{route.url!r} is not http://<host>:<port>")
        if self.networks is not None:
            if self.networks.allows(host):
                return None
            return Refusal(
                "outside_engine_networks", f"{host} is outside the engine networks {self.networks}"
            )
        if self._of_agent(route.agent_address).allows(host):
            return None
        connected_from = connection_host(route.agent_address) or "an unknown address"
        return Refusal(
            "not_the_agent_address",
            f"{host} is not the address its node's agent connected from ({connected_from}); "
            "list the networks engines may live on with --engine-networks to allow it",
        )

    def _of_agent(self, agent_address: str) -> EngineNetworks:
        networks = self._agents.get(agent_address)
        if networks is None:
            if len(self._agents) >= MAX_WARNED_ADDRESSES:
                self._agents.clear()  # nodes come and go: forget the old ones in one go
            networks = self._agents[agent_address] = EngineNetworks.of_connection(agent_address)
        return networks

    def _warn(self, route: Route, refusal: Refusal) -> None:
        address = engine_host(route.url) or route.url
        if address in self._warned or len(self._warned) >= MAX_WARNED_ADDRESSES:
            return
        self._warned.add(address)
        log.warning(
            "engine_address_refused",
            address=address,
            replica_id=route.replica_id,
            model=route.model,
            reason=refusal.explanation,
        )
