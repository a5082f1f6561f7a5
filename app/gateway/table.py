"""What a gateway knows about the cluster: the routing table and the key set.

Both are loaded from the projection (``routing_table`` view, ``models`` and ``api_keys``
tables) as one ``GatewaySnapshot``, replaced whole on every refresh, so a request always
sees one consistent table. A gateway keeps serving from its last snapshot while the
database is away; ``loaded_at`` and ``position`` say how old that snapshot is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from app.domain.model_spec import (
    DEFAULT_APIS,
    DEFAULT_LOAD_FACTOR,
    DEFAULT_PREFIX_BYTES,
    DEFAULT_ROUTING_POLICY,
    SESSION_KEY_SOURCES,
    RoutingPolicy,
    SessionKeySource,
)
from app.domain.revisions import FIRST_REVISION

DEFAULT_TARGET_WAITING = 5
DEFAULT_KV_CEILING = 0.8
_DEFAULT_APIS = frozenset(DEFAULT_APIS)


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """One serving replica of a model, as the gateway sends requests to it."""

    replica_id: str
    model: str
    url: str
    """Base URL of the engine, e.g. ``http://10.0.0.7:8001`` (no trailing slash)."""
    weight: float = 1.0
    target_waiting: int = DEFAULT_TARGET_WAITING
    kv_ceiling: float = DEFAULT_KV_CEILING
    draining: bool = False
    """The replica's node is being drained: it still serves but is last in line."""
    agent_address: str = ""
    """Where the node's agent connected from (``host:port``, as the hub recorded it): the
    one address the gateway contacts the node's engines at when no engine networks are
    configured (``app.gateway.egress``)."""
    revision: int = FIRST_REVISION
    """The revision of its model the replica was placed with (and runs)."""


class Canary(msgspec.Struct, frozen=True, kw_only=True):
    """A model in a rollout's canary step: ``share`` (0 to 1] of its requests go to its
    replicas of ``revision``, the rest to its other replicas (``app.gateway.replica_choice``)."""

    revision: int
    share: float


class StartFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A model failing to start: it is in failure backoff and no replica of it is starting,
    so none will serve before the reconciler places the next one, at ``retry_at``."""

    failures: int
    """Its replicas that failed or timed out in a row."""
    retry_at: float
    """``time.monotonic()`` when its backoff ends and the next replica is placed."""


class RoutePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How the gateway picks among a model's replicas (``RoutingSettings`` of its spec;
    ``docs/gateway-routing.md``)."""

    policy: RoutingPolicy = DEFAULT_ROUTING_POLICY
    load_factor: float = DEFAULT_LOAD_FACTOR
    prefix_bytes: int = DEFAULT_PREFIX_BYTES
    session_keys: tuple[SessionKeySource, ...] = SESSION_KEY_SOURCES
    max_in_flight: int | None = None
    """The most requests this gateway sends one of the model's replicas at once (None: no
    bound beyond admission's): the rest wait in its queue for the first replica with room."""


DEFAULT_ROUTE_POLICY = RoutePolicy()


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as the gateway checks it: never the secret, only its hash."""

    key_id: str
    name: str
    prefix: str
    secret_hash: str
    models: frozenset[str] = frozenset()
    """Models the key may use; empty means every model."""
    rpm: int | None = None
    tpm: int | None = None
    expires_at: float | None = None
    """When the key stops working, in seconds since the epoch by the database's clock; None:
    never. Checked on each request (``app.gateway.asgi.KeyCheck``): no event marks it."""

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


class GatewaySnapshot(msgspec.Struct, frozen=True, kw_only=True):
    declared: frozenset[str] = frozenset()
    """Every declared model, serving or not: a declared model without a serving replica is
    503 (try again), an undeclared one 404."""
    routes: dict[str, tuple[Route, ...]] = {}
    """Serving replicas by model name."""
    canaries: dict[str, Canary] = {}
    """The canary split of each declared model in a rollout's canary step, by name."""
    cold_start_s: dict[str, float] = {}
    """The cold-start timeout of each declared model with an autoscaling policy, by name: a
    request for one that has no route waits up to this long for one, instead of 503 at
    once (``app.gateway.router``)."""
    start_failures: dict[str, StartFailure] = {}
    """The declared models failing to start, by name: a request for one with no route is
    answered at once until its backoff ends, not held nor told to try again shortly."""
    scaled_to_zero: frozenset[str] = frozenset()
    """The declared models without an autoscaling policy that their operator scaled to 0
    replicas: nothing serves them until an operator scales them up."""
    starting: dict[str, int] = {}
    """How many replicas of each declared model are placed or starting and not serving yet,
    by name (absent: none): a model with no route and some here is loading its weights (just
    declared or scaled up, or every replica being replaced), which is no fault, and a
    request for it is told so (``app.gateway.router``)."""
    policies: dict[str, RoutePolicy] = {}
    """The routing policy of each declared model, by name (absent: the default)."""
    created: dict[str, int] = {}
    """When each declared model was first declared, in whole seconds since the epoch, by
    name (absent: unknown); ``GET /v1/models`` says it as OpenAI's ``created``."""
    apis: dict[str, frozenset[str]] = {}
    """The APIs each declared model serves (``ModelSpec.apis``), by name; a model absent
    here serves ``DEFAULT_APIS``."""
    keys: dict[str, KeyRecord] = {}
    """Keys not revoked by public prefix, those expired lately included (their holders are
    told so)."""
    position: int = 0
    """The log position the projection was at when this snapshot was read."""
    loaded_at: float = 0.0
    """``time.monotonic()`` when it was read."""
    clock_offset_s: float = 0.0
    """How far the database's clock was ahead of this gateway's (``time.time()``) when it
    was read (negative: behind). Keys expire by the database's clock, the one their expiry
    was set by: a gateway whose clock is off neither refuses a key early nor serves it
    late."""

    def policy_of(self, model: str) -> RoutePolicy:
        return self.policies.get(model, DEFAULT_ROUTE_POLICY)

    def models_for(self, key: KeyRecord) -> list[str]:
        """The models ``key`` may use, for ``GET /v1/models``."""
        return sorted(m for m in self.declared if key.allows(m))

    def shows(self, key: KeyRecord, model: str) -> bool:
        """Whether ``model`` is one of ``models_for(key)``, for ``GET /v1/models/{model}``."""
        return model in self.declared and key.allows(model)

    def apis_of(self, model: str) -> frozenset[str]:
        """The APIs ``model`` serves."""
        return self.apis.get(model, _DEFAULT_APIS)

    def serves(self, model: str, api: str) -> bool:
        """Whether ``model`` is served on ``api`` (one of ``API_NAMES``)."""
        return api in self.apis.get(model, _DEFAULT_APIS)


SnapshotListener = Callable[[GatewaySnapshot], None]
"""Called with each new snapshot a source reads."""


def models_changed(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """The models whose entry in ``after`` is not the very object ``before`` holds, then
    those ``after`` no longer has. A snapshot keeps the route tuple of every model a read
    did not change, the same object (``app.gateway.held_routes``), so what takes snapshots
    in passes over the others by identity, without comparing their routes."""
    changed = [model for model, value in after.items() if before.get(model) is not value]
    changed.extend(model for model in before if model not in after)
    return changed
