"""The gateway's snapshot, from the rows the store reads (``app.store.routing_rows``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from time import monotonic, time
from types import MappingProxyType

import asyncpg
import msgspec

from app.domain.model_spec import (
    API_NAMES,
    MAX_COLD_START_S,
    MAX_REPLICAS,
    RoutingSettings,
    routing_setting_errors,
)
from app.domain.state import BACKOFF_CAP_S
from app.gateway.held_routes import HeldRoutes, replicas_read_again, routes_after
from app.gateway.table import (
    Canary,
    GatewaySnapshot,
    KeyRecord,
    Route,
    RoutePolicy,
    StartFailure,
)
from app.store.routing_rows import (
    ApisRow,
    CanaryRow,
    ColdStartRow,
    KeyRow,
    PolicyRow,
    RouteRow,
    RoutingRows,
    StartFailureRow,
    read_routing_rows,
)

MAX_UNIX_TIME = 253402300799
"""The end of year 9999 in seconds since the epoch: a model declared later than that, or
before 1970, is a row no clock wrote, read as one of unknown age (``created`` 0)."""


async def read_snapshot(
    db: asyncpg.Connection, *, within_s: float, wall_clock: Callable[[], float] = time
) -> GatewaySnapshot:
    """The routing rows as a snapshot, every route read (``read_routing``)."""
    snapshot, _ = await read_routing(db, within_s=within_s, wall_clock=wall_clock)
    return snapshot


async def read_routing(
    db: asyncpg.Connection,
    *,
    within_s: float,
    held: HeldRoutes | None = None,
    wall_clock: Callable[[], float] = time,
) -> tuple[GatewaySnapshot, HeldRoutes]:
    """The routing rows as a snapshot, and its routes to hold for the next read. With
    ``held``, only the routes changed since its position are read (``app.gateway.held_routes``)."""
    since = held.position if held is not None else None
    dated = await read_dated_rows(db, within_s=within_s, since=since, wall_clock=wall_clock)
    return routing_of(dated, held)


class DatedRows(msgspec.Struct, frozen=True):
    """Routing rows, and how far the database's clock was ahead of this machine's."""

    rows: RoutingRows
    clock_offset_s: float


async def read_dated_rows(
    db: asyncpg.Connection,
    *,
    within_s: float,
    since: int | None,
    wall_clock: Callable[[], float] = time,
) -> DatedRows:
    """The routing rows (``read_routing_rows``), dated: the database read its clock between
    this machine's (``wall_clock``) two readings around the statement, so the offset is
    right to within half the round trip."""
    sent = wall_clock()
    rows = await read_routing_rows(db, within_s=within_s, since=since)
    received = wall_clock()
    return DatedRows(rows, rows.database_now - (sent + received) / 2)


def routing_of(dated: DatedRows, held: HeldRoutes | None) -> tuple[GatewaySnapshot, HeldRoutes]:
    """The snapshot rows read since ``held``'s position make (or rows of every route), and
    the routes to hold for the next read. Each model whose routes the read did not change
    keeps its tuple from ``held``."""
    rows = dated.rows
    after = routes_after(held, rows)
    if held is None or held.routes is None:
        by_model = routes_by_model(after.rows.values())
    else:
        by_model = routes_changed(held, after, replicas_read_again(held, after, rows))
    after = msgspec.structs.replace(after, routes=by_model)
    rows = msgspec.structs.replace(rows, routes=[], changed=None)
    return snapshot_of_rows(rows, clock_offset_s=dated.clock_offset_s, by_model=by_model), after


def route_of(row: RouteRow) -> Route:
    return Route(
        replica_id=row.replica_id,
        model=row.model,
        url=engine_url(row.address, row.port),
        weight=row.weight,
        target_waiting=row.target_waiting,
        kv_ceiling=row.kv_ceiling,
        draining=row.draining,
        agent_address=row.agent_address,
        revision=row.revision,
    )


def routes_by_model(rows: Iterable[RouteRow]) -> dict[str, tuple[Route, ...]]:
    """The routes of ``rows`` by model, each model's in the order of their replica ids."""
    by_model: dict[str, list[Route]] = {}
    for row in sorted(rows, key=lambda r: r.replica_id):
        by_model.setdefault(row.model, []).append(route_of(row))
    return {model: tuple(routes) for model, routes in by_model.items()}


def routes_changed(
    held: HeldRoutes, after: HeldRoutes, read_again: Set[str]
) -> dict[str, tuple[Route, ...]]:
    """The routes by model once a read took ``held`` to ``after``, reading the routes of
    ``read_again`` again: a new tuple for each model one of them was or is routed for, built
    of its routes not read again and the new ones; every other model's tuple as ``held`` has
    it, the same object (``app.gateway.held_routes``)."""
    before = held.routes or {}
    touched = {rows[r].model for rows in (held.rows, after.rows) for r in read_again if r in rows}
    by_model = dict(before)
    for model in touched:
        routes = [route for route in before.get(model, ()) if route.replica_id not in read_again]
        routes.extend(
            route_of(row)
            for r in read_again
            if (row := after.rows.get(r)) is not None and row.model == model
        )
        if routes:
            by_model[model] = tuple(sorted(routes, key=lambda route: route.replica_id))
        else:
            by_model.pop(model, None)
    return by_model


def snapshot_of_rows(
    rows: RoutingRows,
    *,
    clock_offset_s: float = 0.0,
    by_model: Mapping[str, tuple[Route, ...]] | None = None,
) -> GatewaySnapshot:
    """The snapshot the routing ``rows`` make, taken now (``monotonic``); ``by_model``: its
    routes, built already (``rows.routes`` then unread)."""
    return build_snapshot(
        rows.position,
        rows.declared,
        rows.routes,
        rows.keys,
        monotonic(),
        by_model=by_model,
        canaries=rows.canaries,
        cold_starts=rows.cold_starts,
        start_failures=rows.start_failures,
        scaled_to_zero=rows.scaled_to_zero,
        starting=rows.starting,
        policies=rows.policies,
        apis=rows.apis,
        created=rows.created,
        clock_offset_s=clock_offset_s,
    )


def engine_url(address: str, port: int) -> str:
    """``http://address:port``, the address agents register with; IPv6 in brackets."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{port}"


def build_snapshot(
    position: int,
    declared: list[str],
    routes: list[RouteRow],
    keys: list[KeyRow],
    at: float,
    *,
    canaries: Sequence[CanaryRow] = (),
    cold_starts: Sequence[ColdStartRow] = (),
    start_failures: Sequence[StartFailureRow] = (),
    scaled_to_zero: Sequence[str] = (),
    starting: Mapping[str, int] = MappingProxyType({}),
    policies: Sequence[PolicyRow] = (),
    apis: Sequence[ApisRow] = (),
    created: Mapping[str, int] = MappingProxyType({}),
    clock_offset_s: float = 0.0,
    by_model: Mapping[str, tuple[Route, ...]] | None = None,
) -> GatewaySnapshot:
    """``by_model``: the routes, built already (``routes`` then unread); each model's tuple
    is taken as it is, the same object, so that those of models no read changed stay the
    tuples the last snapshot had."""
    names = frozenset(declared)
    return GatewaySnapshot(
        declared=names,
        routes=dict(by_model) if by_model is not None else routes_by_model(routes),
        canaries={
            c.model: Canary(revision=c.revision, share=c.traffic)
            for c in canaries
            if c.model in names and is_share(c.traffic)
        },
        cold_start_s={
            c.model: c.timeout_s
            for c in cold_starts
            if c.model in names and is_cold_start_timeout(c.timeout_s)
        },
        start_failures={
            f.model: StartFailure(failures=f.failures, retry_at=at + f.retry_in_s)
            for f in start_failures
            if f.model in names and is_backoff_left(f.retry_in_s)
        },
        scaled_to_zero=names.intersection(scaled_to_zero),
        starting={
            model: replicas
            for model, replicas in starting.items()
            if model in names and is_replica_count(replicas)
        },
        apis={a.model: served_apis(a.apis) for a in apis if a.model in names},
        created={
            model: at
            for model, at in created.items()
            if model in names and 0 <= at <= MAX_UNIX_TIME
        },
        policies={
            p.model: policy
            for p in policies
            if p.model in names and (policy := route_policy(p.routing)) is not None
        },
        keys={
            k.prefix: KeyRecord(
                key_id=k.id,
                name=k.name,
                prefix=k.prefix,
                secret_hash=k.secret_hash,
                models=frozenset(k.models),
                rpm=k.rpm,
                tpm=k.tpm,
                expires_at=k.expires_at.timestamp() if k.expires_at is not None else None,
            )
            for k in keys
        },
        position=position,
        loaded_at=at,
        clock_offset_s=clock_offset_s if math.isfinite(clock_offset_s) else 0.0,
    )


def is_share(traffic: float) -> bool:
    """A canary's share of requests is above 0 and at most 1 (the domain allows no other); a
    row with any other is taken for no canary, so the model's routing stays as without one."""
    return math.isfinite(traffic) and 0.0 < traffic <= 1.0


def is_cold_start_timeout(timeout_s: float) -> bool:
    """A cold-start timeout is above 0 and at most ``MAX_COLD_START_S`` (the spec allows no
    other); a row with any other is taken for none, so the model's requests are not held."""
    return math.isfinite(timeout_s) and 0.0 < timeout_s <= MAX_COLD_START_S


def is_replica_count(replicas: int) -> bool:
    """A model's replicas placed or starting are some above 0 and no more than it may have,
    each with a replacement (``MAX_REPLICAS`` twice); a row with any other count is taken for
    none, so the model's requests are refused as without one."""
    return 0 < replicas <= 2 * MAX_REPLICAS


def is_backoff_left(retry_in_s: float) -> bool:
    """A failure backoff still running is some time above 0 and no longer than the longest
    the reconciler waits (``BACKOFF_CAP_S``); a row with any other is taken for none, so
    the model's requests are held or refused as without one."""
    return math.isfinite(retry_in_s) and 0.0 < retry_in_s <= BACKOFF_CAP_S


_routing_decoder = msgspec.json.Decoder(RoutingSettings)


def route_policy(routing: bytes) -> RoutePolicy | None:
    """The routing policy of a model's routing settings as its spec holds them; ``None``
    (the default policy) when they do not read as settings the spec allows."""
    try:
        settings = _routing_decoder.decode(routing)
    except msgspec.MsgspecError:
        return None
    if routing_setting_errors(settings):
        return None
    return RoutePolicy(
        policy=settings.policy,
        load_factor=settings.load_factor,
        prefix_bytes=settings.prefix_bytes,
        session_keys=settings.session_keys,
        max_in_flight=settings.max_in_flight,
    )


def served_apis(names: Sequence[object]) -> frozenset[str]:
    """The APIs a spec names that the gateway knows (the spec allows no other); a row
    naming none of them serves none, rather than more than its spec says."""
    return frozenset(name for name in names if isinstance(name, str) and name in API_NAMES)
