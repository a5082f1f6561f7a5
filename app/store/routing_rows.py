"""What a gateway routes by, read from the projection in one statement.

Declared models (removed ones are not: they answer 404 like any unknown model) with when
each was first declared, the canary split of those in a rollout's canary step, the
cold-start timeout of those with an autoscaling policy (``spec->'autoscale'``), the APIs
of those whose spec names them (``spec->'apis'``) and the routing settings of each
(``spec->'routing'``, for its routing policy), the models failing to start (in failure
backoff with no replica starting: how many failed in a row and the seconds until the next
attempt) and those scaled to zero without an autoscaling policy, how many replicas of each
model are placed or starting (not serving yet), the ``routing_table`` view with
each route's revision and the address its node connected from (the gateway's egress check
allows that address by default), the API keys not revoked (expired ones too, for
``EXPIRED_KEYS_KEPT``), the projection's position and the database's clock (the gateway
checks keys' expiry by it, not by its own). One statement sees one snapshot of
the database, as a REPEATABLE READ transaction of several would, in one round trip instead
of ten. The gateway turns these rows into its routing table (``app.gateway.snapshot``).

The routes are nearly all of the answer (99.5 % of its 3.7 MiB at 20,000 replicas) and of
its cost, and a change of the projection changes few of them. So a gateway that holds the
routes as of a position asks for the routes changed since (``since``): the statement looks
up the replicas, nodes and models the events after that position are about (the log's
``replica_id``, ``node_id`` and ``model`` columns) and reads the routes of those alone,
through the primary keys and the ``shards.node_id`` and ``replicas.model`` indexes, saying
which it read (``RouteChanges``); the rest of the answer is read whole, as it is small.
Appends are serialised and move the checkpoint in their transaction, so the events up to
the checkpoint this statement sees are exactly those its rows reflect.

The projection keeps the rows of every replica that ever ran, so a read of every route
must not pass over the ended ones: it finds the routable replicas through their partial
index (0018) and, once the shards are many per routable replica, looks each one's first
shard up by the shards' primary key rather than scanning every shard
(``SHARDS_PER_ROUTE_SCANNED``), so that it costs the live fleet, not the history.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from app.domain.model_spec import MAX_COLD_START_S
from app.domain.revisions import FIRST_REVISION
from app.store.postgres import CHECKPOINT

_READ_ROWS_OF = """
WITH checkpoint AS MATERIALIZED (
  SELECT coalesce((SELECT position FROM projection_checkpoints WHERE name = $1), 0) AS position),
changes AS MATERIALIZED (
  SELECT e.replica_id, e.node_id, e.model FROM events e
  WHERE $4::bigint >= 0
    AND e.position > $4::bigint AND e.position <= (SELECT position FROM checkpoint)
  LIMIT $5::int + 1),
whole AS MATERIALIZED (
  SELECT $4::bigint < 0 OR $4::bigint > (SELECT position FROM checkpoint)
         OR (SELECT count(*) FROM changes) > $5::int AS whole),
touched AS MATERIALIZED (
  SELECT ARRAY(SELECT DISTINCT replica_id FROM changes WHERE replica_id IS NOT NULL) AS replicas,
         ARRAY(SELECT DISTINCT node_id FROM changes WHERE node_id IS NOT NULL) AS nodes,
         ARRAY(SELECT DISTINCT model FROM changes WHERE model IS NOT NULL) AS models),
affected AS MATERIALIZED (
  -- An array, not a subquery: the planner then looks each up by primary key, where for a
  -- subquery it guessed a thousand rows and scanned every replica. The models' array too,
  -- looked up in the routable replicas' index (0018): joined with touched, an empty one
  -- read every routable replica.
  SELECT ARRAY(
    SELECT unnest(replicas) FROM touched
    UNION SELECT s.replica_id FROM shards s, touched
          WHERE s.node_id = ANY(touched.nodes) AND s.shard_index = 0
    UNION SELECT r.id FROM replicas r
          WHERE r.model = ANY((SELECT models FROM touched)::text[]) AND r.routable) AS ids),
routes AS (
--every route--
  UNION ALL
  SELECT t.replica_id, t.model, t.address, t.port, t.weight, t.target_waiting,
         t.kv_ceiling, t.draining, t.revision,
         coalesce(n.remote_address, '') AS agent_address
  FROM routing_table t LEFT JOIN nodes n ON n.id = t.node_id
  WHERE NOT (SELECT whole FROM whole) AND t.replica_id = ANY((SELECT ids FROM affected)::text[]))
SELECT
  (SELECT position FROM checkpoint) AS position,
  (SELECT CASE WHEN w.whole THEN NULL ELSE json_build_object('replicas', a.ids) END
   FROM whole w, affected a) AS changed,
  extract(epoch FROM statement_timestamp())::float8 AS database_now,
  (SELECT coalesce(json_agg(name), '[]') FROM models WHERE NOT removed) AS declared,
  (SELECT coalesce(json_object_agg(name, floor(extract(epoch FROM declared_at))::bigint), '{}')
   FROM models WHERE NOT removed) AS created,
  (SELECT coalesce(json_agg(c), '[]') FROM (
     SELECT name AS model, canary_revision AS revision, canary_traffic AS traffic
     FROM models
     WHERE NOT removed AND canary_revision IS NOT NULL AND canary_traffic IS NOT NULL) c)
    AS canaries,
  (SELECT coalesce(json_agg(c), '[]') FROM (
     SELECT model, timeout_s FROM (
       SELECT name AS model,
              CASE WHEN jsonb_typeof(spec->'autoscale'->'cold_start_timeout_s') = 'number'
                   THEN (spec->'autoscale'->'cold_start_timeout_s')::numeric END AS timeout_s
       FROM models WHERE NOT removed) a
     WHERE timeout_s > 0 AND timeout_s <= $2) c)
    AS cold_starts,
  (SELECT coalesce(json_agg(p), '[]') FROM (
     SELECT name AS model, spec->'routing' AS routing
     FROM models WHERE NOT removed AND jsonb_typeof(spec->'routing') = 'object') p)
    AS policies,
  (SELECT coalesce(json_agg(a), '[]') FROM (
     SELECT name AS model, spec->'apis' AS apis
     FROM models WHERE NOT removed AND jsonb_typeof(spec->'apis') = 'array') a) AS apis,
  (SELECT coalesce(json_agg(f), '[]') FROM (
     SELECT m.name AS model, m.failures,
            extract(epoch FROM m.backoff_until - now())::float8 AS retry_in_s
     FROM models m
     WHERE NOT m.removed AND m.failures > 0 AND m.backoff_until > now()
       AND NOT EXISTS (SELECT 1 FROM replicas r
                       WHERE r.model = m.name AND r.phase IN ('placed', 'starting'))) f)
    AS start_failures,
  (SELECT coalesce(json_agg(name), '[]') FROM models
   WHERE NOT removed AND desired_replicas = 0
     AND jsonb_typeof(spec->'autoscale') IS DISTINCT FROM 'object') AS scaled_to_zero,
  (SELECT coalesce(json_object_agg(model, replicas), '{}') FROM (
     SELECT model, count(*) AS replicas FROM replicas
     WHERE phase IN ('placed', 'starting') GROUP BY model) s) AS starting,
  (SELECT coalesce(json_agg(r), '[]') FROM routes r) AS routes,
  (SELECT coalesce(json_agg(k), '[]') FROM (
     SELECT id, name, prefix, secret_hash, models, rpm, tpm, expires_at
     FROM api_keys
     WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now() - $3::interval)) k)
    AS keys
"""
"""The statement, but for how it reads every route (``--every route--``): one of the two
below. Both read ``routing_table``'s rows; the caller picks by the planner's statistics
(``_FIRST_SHARDS_LOOKED_UP``) and each statement plans only its own way, so neither
way's estimate adds to the other's (past ``jit_above_cost``, 100,000 by default,
PostgreSQL compiles the statement first, for about 90 ms)."""

_EVERY_ROUTE_SCANNING_SHARDS = """
  SELECT t.replica_id, t.model, t.address, t.port, t.weight, t.target_waiting,
         t.kv_ceiling, t.draining, t.revision,
         coalesce(n.remote_address, '') AS agent_address
  FROM routing_table t LEFT JOIN nodes n ON n.id = t.node_id
  WHERE (SELECT whole FROM whole)"""

_EVERY_ROUTE_LOOKING_UP_SHARDS = """
  -- routing_table's rows, each replica's first shard looked up by the shards' primary key.
  -- ANY(ARRAY[r.id]), not r.id: the planner may not hash or merge this join, where for an
  -- equality it scans every shard (it costs each lookup as if from disk).
  SELECT r.id AS replica_id, r.model, n.address, s.port,
         coalesce(r.weight, m.weight) AS weight,
         coalesce(r.target_waiting, m.target_waiting) AS target_waiting,
         coalesce(r.kv_ceiling, m.kv_ceiling) AS kv_ceiling,
         r.phase = 'draining' AS draining, r.revision,
         coalesce(n.remote_address, '') AS agent_address
  FROM replicas r
  JOIN models m ON m.name = r.model
  JOIN shards s ON s.replica_id = ANY(ARRAY[r.id]) AND s.shard_index = 0
  JOIN nodes n ON n.id = s.node_id
  WHERE r.routable AND (SELECT whole FROM whole)"""

_READ_ROWS = _READ_ROWS_OF.replace("--every route--", _EVERY_ROUTE_SCANNING_SHARDS.strip("\n"))
_READ_ROWS_LOOKING_UP_SHARDS = _READ_ROWS_OF.replace(
    "--every route--", _EVERY_ROUTE_LOOKING_UP_SHARDS.strip("\n")
)

_FIRST_SHARDS_LOOKED_UP = """
SELECT coalesce((SELECT reltuples FROM pg_class WHERE oid = 'shards'::regclass)
                > $1::float8 * (SELECT reltuples FROM pg_class
                                WHERE oid = to_regclass('ix_replicas_routable')),
                false)
"""
"""Whether the shards are more than ``$1`` per routable replica, by the planner's
statistics (the shards and the entries of the routable replicas' index, 0018, as of the
last VACUUM or ANALYZE): false where they are unknown (never analysed, or no index)."""

EXPIRED_KEYS_KEPT = timedelta(days=30)
"""How long after it expired a key is still read: the gateway checks expiry itself, on each
request, and answers a key it holds that it expired (and when). Keys given to CI runs
expire by the thousand and are seldom revoked: past this, a gateway no longer holds them
and an old one is an unknown key."""


class RouteRow(msgspec.Struct, frozen=True):
    replica_id: str
    model: str
    address: str
    port: int
    weight: float
    target_waiting: int
    kv_ceiling: float
    draining: bool
    agent_address: str = ""
    revision: int = FIRST_REVISION


class RouteChanges(msgspec.Struct, frozen=True):
    """The replicas a read of the changes since a position read the routes of again: every
    replica an event since then names, every replica whose first shard is on a node one
    names, every routable replica of a model one names (the events' ``replica_id``,
    ``node_id`` and ``model`` columns, the fold's ``subjects``). A route held from before
    of one of these replicas that the read did not return is gone.

    That is all that can have changed: a route is a row of ``replicas`` with its first
    ``shards`` row (a shard adopted on another node is named by the event that adopts it),
    its ``models`` row and its ``nodes`` row, and ``llmgw_append`` writes the rows only of
    the entities its events are about (0017), each named by an event's columns, but for the
    model of a replica an event names, whose row an append writes for its counts (failures,
    replicas created) and never for what a route reads of it (its routing settings change
    only with an event about the model). A replica taken out of routing is named by the
    event that did it."""

    replicas: list[str]


class CanaryRow(msgspec.Struct, frozen=True):
    """A declared model in a rollout's canary step: ``traffic`` (0 to 1] of its requests
    go to its replicas of ``revision``."""

    model: str
    revision: int
    traffic: float


class ColdStartRow(msgspec.Struct, frozen=True):
    """A declared model with an autoscaling policy: a request for it while it has no
    route waits up to ``timeout_s`` for one. Only timeouts the spec allows are read: a
    row with another (not a number, 0, past ``MAX_COLD_START_S``) is taken for none."""

    model: str
    timeout_s: float


class StartFailureRow(msgspec.Struct, frozen=True):
    """A declared model in failure backoff (``Model.backoff_until``) with no replica placed
    or starting: ``failures`` of its replicas failed or timed out in a row, the reconciler
    places the next one in ``retry_in_s`` (by the database's clock, when it was read). Why
    they failed is not read: it is the operators' (``llmgw-cli model``), not the clients'."""

    model: str
    failures: int
    retry_in_s: float


class PolicyRow(msgspec.Struct, frozen=True):
    """A declared model's routing settings as its spec holds them (``spec->'routing'``),
    read raw: the gateway takes the policy from them (``app.gateway.snapshot``)."""

    model: str
    routing: msgspec.Raw


class ApisRow(msgspec.Struct, frozen=True):
    """The APIs a declared model's spec says it serves (``spec->'apis'``); a model whose
    spec names none (declared before specs could) has no row and serves the default."""

    model: str
    apis: list[Any]
    """As the spec holds them: the gateway keeps the names it knows (``app.gateway.snapshot``)."""


class KeyRow(msgspec.Struct, frozen=True):
    id: str
    name: str
    prefix: str
    secret_hash: str
    models: list[str]
    rpm: int | None
    tpm: int | None
    expires_at: datetime | None = None
    """Expired keys are read too: the gateway tells their holders that they expired."""


class RoutingRows(msgspec.Struct, frozen=True):
    position: int
    """The log position the projection was at."""
    declared: list[str]
    created: dict[str, int]
    """When each declared model was first declared (``declared_at``; again after a removal),
    in whole seconds since the epoch."""
    canaries: list[CanaryRow]
    cold_starts: list[ColdStartRow]
    start_failures: list[StartFailureRow]
    scaled_to_zero: list[str]
    """Declared models its operator scaled to 0 replicas, without an autoscaling policy."""
    starting: dict[str, int]
    """How many replicas of each model are placed or starting and not serving yet (a model
    with none has no entry; removed models' too: the gateway keeps the declared ones)."""
    policies: list[PolicyRow]
    routes: list[RouteRow]
    apis: list[ApisRow]
    keys: list[KeyRow]
    database_now: float = 0.0
    """The database's clock as the statement began, in seconds since the epoch."""
    changed: RouteChanges | None = None
    """For a read of the changes since a position: ``routes`` are only the routes it read
    again (everything else is whole). ``None``: ``routes`` are all of them."""


_declared_decoder = msgspec.json.Decoder(list[str])
_created_decoder = msgspec.json.Decoder(dict[str, int])
_canaries_decoder = msgspec.json.Decoder(list[CanaryRow])
_cold_starts_decoder = msgspec.json.Decoder(list[ColdStartRow])
_starting_decoder = msgspec.json.Decoder(dict[str, int])
_start_failures_decoder = msgspec.json.Decoder(list[StartFailureRow])
_policies_decoder = msgspec.json.Decoder(list[PolicyRow])
_routes_decoder = msgspec.json.Decoder(list[RouteRow])
_keys_decoder = msgspec.json.Decoder(list[KeyRow])
_apis_decoder = msgspec.json.Decoder(list[ApisRow])
_changed_decoder = msgspec.json.Decoder(RouteChanges | None)

MAX_EVENTS_READ_AS_CHANGES = 1_000
"""A read since a position further back than this many events reads every route instead:
past that, looking up what so many events name costs about as much as reading them all."""

SHARDS_PER_ROUTE_SCANNED = 10.0
"""A read of every route scans every shard and hashes the routable replicas' first ones
out, unless the shards are more than this many per routable replica: then it looks each
routable replica's first shard up by the shards' primary key instead. The projection keeps
the shards of every replica that ever ran, so the scan costs the history and the lookups
the live fleet; at 20,000 routable replicas the two cost the same at about 10 shards each
(docs/performance.md, "A read of every route and the projection's history")."""


def statement_arguments(since: int | None) -> tuple[object, ...]:
    """The arguments of the statement, for a read since ``since`` (``None``: of every
    route)."""
    return (
        CHECKPOINT,
        MAX_COLD_START_S,
        EXPIRED_KEYS_KEPT,
        -1 if since is None else since,
        MAX_EVENTS_READ_AS_CHANGES,
    )


async def routing_statement(
    db: asyncpg.Connection,
    *,
    since: int | None,
    within_s: float,
    first_shards_looked_up: bool | None = None,
) -> str:
    """The statement of a read since ``since``: for a read of every route, the one that
    looks the routable replicas' first shards up if the shards are more than
    ``SHARDS_PER_ROUTE_SCANNED`` per routable replica (one more round trip, every 30 s),
    unless ``first_shards_looked_up`` says which. A read of changes that turns into a read
    of every route (``MAX_EVENTS_READ_AS_CHANGES``, a rebuilt projection) scans them."""
    if first_shards_looked_up is None:
        first_shards_looked_up = since is None and await shards_many_per_route(
            db, within_s=within_s
        )
    return _READ_ROWS_LOOKING_UP_SHARDS if first_shards_looked_up else _READ_ROWS


async def shards_many_per_route(db: asyncpg.Connection, *, within_s: float) -> bool:
    """Whether the shards are more than ``SHARDS_PER_ROUTE_SCANNED`` per routable replica,
    by the planner's statistics: a read of every route then looks the routable replicas'
    first shards up rather than scanning every shard."""
    return bool(
        await db.fetchval(_FIRST_SHARDS_LOOKED_UP, SHARDS_PER_ROUTE_SCANNED, timeout=within_s)
    )


async def read_routing_rows(
    db: asyncpg.Connection,
    *,
    within_s: float,
    since: int | None = None,
    first_shards_looked_up: bool | None = None,
) -> RoutingRows:
    """The rows a gateway routes by. ``since``: the position of the routes the caller holds;
    the routes read are then only those that may have changed after it (``changed`` says
    which), unless the projection is behind it (rebuilt) or more than
    ``MAX_EVENTS_READ_AS_CHANGES`` events came since, when every route is read, as without
    ``since``. ``first_shards_looked_up``: how a read of every route finds the replicas'
    first shards, looked up or by a scan of every shard (``routing_statement``); both read
    the same routes, at different costs."""
    statement = await routing_statement(
        db, since=since, within_s=within_s, first_shards_looked_up=first_shards_looked_up
    )
    row = await db.fetchrow(statement, *statement_arguments(since), timeout=within_s)
    assert row is not None  # a SELECT without FROM returns one row
    return RoutingRows(
        position=int(row["position"] or 0),
        declared=_declared_decoder.decode(row["declared"]),
        created=_created_decoder.decode(row["created"]),
        canaries=_canaries_decoder.decode(row["canaries"]),
        cold_starts=_cold_starts_decoder.decode(row["cold_starts"]),
        start_failures=_start_failures_decoder.decode(row["start_failures"]),
        scaled_to_zero=_declared_decoder.decode(row["scaled_to_zero"]),
        starting=_starting_decoder.decode(row["starting"]),
        policies=_policies_decoder.decode(row["policies"]),
        routes=_routes_decoder.decode(row["routes"]),
        keys=_keys_decoder.decode(row["keys"]),
        apis=_apis_decoder.decode(row["apis"]),
        database_now=float(row["database_now"]),
        changed=_changed_decoder.decode(row["changed"] or "null"),
    )
