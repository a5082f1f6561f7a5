"""Replicas the fold forgot, read back: from the projection tables (for lists) and from the
log (one replica, exactly as the fold had it).

The fold keeps a few ended replicas per model (``ENDED_KEPT_PER_MODEL``); the ``replicas``
and ``shards`` tables keep every replica with the row it had when the fold last changed it,
and the log keeps every event about it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime

import asyncpg
from msgspec.structs import replace
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Recorded
from app.domain.model_spec import RoutingSettings
from app.domain.replica_listing import ReplicaPage
from app.domain.state import ENDED_PHASES, Replica, ReplicaFilter, ReplicaPhase, Shard, ShardPhase
from app.store.codec import RECORDED_COLUMNS, record_from_row
from app.store.database import connection

_PAGE_ORDER = 'r.model COLLATE "C", r.number, r.id COLLATE "C"'
"""The list's order, byte by byte as Python compares the fold's replicas, whatever the
database's collation, so that a page of both sorts as one list."""

_ENDED_ROWS = f"""
WITH page AS (
    SELECT r.* FROM replicas r WHERE {{where}} ORDER BY {_PAGE_ORDER} {{limit}}
)
SELECT r.id, r.model, r.number, r.phase, r.routable, r.placed_at, r.reason, r.replaces,
       r.starting_since, r.serving_since, r.drain_id, r.drain_started_at, r.replacement_id,
       r.ended_at, r.end_reason, r.weight, r.target_waiting, r.kv_ceiling, r.revision,
       s.shard_index, s.node_id, s.gpus, s.port, s.phase AS shard_phase, s.pid, s.came_up,
       s.error, s.exit_code, s.log_tail
FROM page r JOIN shards s ON s.replica_id = r.id
ORDER BY {_PAGE_ORDER}, s.shard_index
"""
"""The page's replicas (``where``, ``limit``: see ``ended_rows_statement``), then their shards."""

_ANY_ENDED = "SELECT EXISTS (SELECT 1 FROM replicas r WHERE {where})"
"""Whether a replica ``where`` holds is in the tables (see ``any_ended_statement``)."""
_FIRST_OF_MODEL = f"SELECT true FROM replicas r WHERE {{where}} ORDER BY {_PAGE_ORDER} LIMIT 1"
"""The same, for a ``where`` of one model: true, or no row."""

_ABOUT_REPLICA = f"SELECT {RECORDED_COLUMNS} FROM events WHERE replica_id = $1 ORDER BY position"


async def read_forgotten_replicas(
    engine: AsyncEngine, known: Collection[str], among: ReplicaFilter, page: ReplicaPage
) -> list[Replica]:
    """``LogQueries.forgotten_replicas`` from the tables' rows: the fields they do not keep
    (``stopping_since``, ``agent_stopped_at``, a shard's ``epoch`` and ``stop_reason``) are
    left at their defaults, which a summary does not show. Only the page's replicas are
    read: the tables keep every replica that ever ended."""
    phases = [p.value for p in ENDED_PHASES if among.phase is None or p is among.phase]
    if not phases or not among.ended:  # the fold holds every replica not ended
        return []
    if "\x00" in (among.model or "") + (among.node_id or ""):
        return []  # PostgreSQL text cannot hold it: no stored id has one
    async with connection(engine) as db:
        query, args = ended_rows_statement(phases, known, among, page)
        rows = await db.fetch(query, *args)
    replicas: dict[str, Replica] = {}
    shards: dict[str, list[Shard]] = {}
    for row in rows:
        shards.setdefault(row["id"], []).append(_shard(row))
        if row["id"] not in replicas:
            replicas[row["id"]] = _replica(row)
    return [replace(r, shards=tuple(shards[r.id])) for r in replicas.values()]


def ended_rows_statement(
    phases: list[str], known: Collection[str], among: ReplicaFilter, page: ReplicaPage
) -> tuple[str, list[object]]:
    """The query of the page's replicas in ``phases`` that ``known`` (every replica the
    fold holds, whatever its phase: the tables may be ahead of the fold, with a replica it
    holds as active ended there) lacks, and its arguments. Only the conditions the filter
    and the page set are written: one that may be switched off (``$3 IS NULL OR ...``)
    hides an index from the planner, as a node's from its shards."""
    args: list[object] = [phases, list(known)]
    where = ["r.phase = ANY($1::text[])", "r.id <> ALL($2::text[])"]

    def arg(value: object) -> str:
        args.append(value)
        return f"${len(args)}"

    where += _filter_conditions(among, arg)
    if page.after is not None:
        model, number, replica_id = page.after
        start = f"{arg(model)}::text, {arg(number)}::int, {arg(replica_id)}::text"
        where.append(f"({_PAGE_ORDER}) > ({start})")
    limit = "" if page.limit is None else f"LIMIT {arg(page.limit)}::bigint"
    return _ENDED_ROWS.format(where=" AND ".join(where), limit=limit), args


def _filter_conditions(among: ReplicaFilter, arg: Callable[[object], str]) -> list[str]:
    """The conditions of ``among``'s model and node, each written only when it is given;
    ``arg`` adds a value to the statement's arguments and names it."""
    conditions = []
    if among.model is not None:
        # Byte by byte, as the list's index holds the model (0019): equality is the same
        # under every deterministic collation, and so the page is read off that index.
        conditions.append(f'r.model COLLATE "C" = {arg(among.model)}::text')
    if among.node_id is not None:
        node = arg(among.node_id)
        conditions.append(f"r.id IN (SELECT replica_id FROM shards WHERE node_id = {node}::text)")
    return conditions


async def any_ended_replica(engine: AsyncEngine, among: ReplicaFilter) -> bool:
    """``LogQueries.any_ended_replica`` from the tables, which hold every replica, the fold's
    too (they are written with the events, ahead of any process's fold)."""
    phases = [p for p in ENDED_PHASES if among.phase is None or p is among.phase]
    if not phases:
        return False
    if "\x00" in (among.model or "") + (among.node_id or ""):
        return False  # PostgreSQL text cannot hold it: no stored id has one
    async with connection(engine) as db:
        query, args = any_ended_statement(phases, among)
        return bool(await db.fetchval(query, *args))


def any_ended_statement(
    phases: Collection[ReplicaPhase], among: ReplicaFilter
) -> tuple[str, list[object]]:
    """The query of whether a replica in ``phases`` is ``among`` those asked for, and its
    arguments; it stops at the first row it finds.

    asyncpg prepares the statement and PostgreSQL soon plans it once for any argument: for
    an ``EXISTS`` of one model's ended replicas that plan is a scan of the table, which
    finds one at once for a model with thousands but reads every row for one without any
    (25-90 ms of 320,000 rows; docs/performance.md). So a model's are read off the list's
    index (model first) in its order, which no plan can do without, and the phases (the
    enum's values, never a client's text) are written into the statement, each set with
    plans of its own: one that no replica is in (``lost``) is then looked up in the index
    of phases rather than scanned for."""
    written = ", ".join(f"'{phase.value}'" for phase in sorted(phases))
    args: list[object] = []

    def arg(value: object) -> str:
        args.append(value)
        return f"${len(args)}"

    where = " AND ".join([f"r.phase IN ({written})", *_filter_conditions(among, arg)])
    if among.model is not None:
        return _FIRST_OF_MODEL.format(where=where), args
    return _ANY_ENDED.format(where=where), args


_COUNT_ENDED = (
    "SELECT model, count(*) FROM replicas WHERE phase = ANY($1::text[]) AND ended_at <= $2 "
    "GROUP BY model"
)


async def count_ended(engine: AsyncEngine, before: datetime) -> dict[str, int]:
    """``LogQueries.ended_replicas_by_model``: the rows ``ended_replicas_forgotten`` of
    each model with ``before`` would delete."""
    phases = [p.value for p in ENDED_PHASES]
    async with connection(engine) as db:
        rows = await db.fetch(_COUNT_ENDED, phases, before)
    return {row[0]: int(row[1]) for row in rows}


async def read_about_replica(engine: AsyncEngine, replica_id: str) -> list[Recorded]:
    """Every event about the replica (``subjects(event).replica``), in order."""
    if "\x00" in replica_id:  # PostgreSQL text cannot hold it: no stored id has one
        return []
    async with connection(engine) as db:
        rows = await db.fetch(_ABOUT_REPLICA, replica_id)
    return [record_from_row(row) for row in rows]


def _replica(row: asyncpg.Record) -> Replica:
    get = row.__getitem__
    routing = (
        RoutingSettings(
            weight=get("weight"),
            target_waiting=get("target_waiting"),
            kv_ceiling=get("kv_ceiling"),
        )
        if get("weight") is not None
        else None
    )
    return Replica(
        id=get("id"),
        model=get("model"),
        number=get("number"),
        phase=ReplicaPhase(get("phase")),
        shards=(),
        placed_at=get("placed_at"),
        reason=get("reason"),
        replaces=get("replaces"),
        starting_since=get("starting_since"),
        serving_since=get("serving_since"),
        drain_id=get("drain_id"),
        drain_started_at=get("drain_started_at"),
        replacement_id=get("replacement_id"),
        routable=get("routable"),
        ended_at=get("ended_at"),
        end_reason=get("end_reason"),
        routing=routing,
        revision=get("revision"),
    )


def _shard(row: asyncpg.Record) -> Shard:
    get = row.__getitem__
    return Shard(
        index=get("shard_index"),
        node_id=get("node_id"),
        gpus=tuple(get("gpus")),
        port=get("port"),
        phase=ShardPhase(get("shard_phase")),
        pid=get("pid"),
        came_up=get("came_up"),
        error=get("error"),
        exit_code=get("exit_code"),
        log_tail=tuple(get("log_tail")),
    )
