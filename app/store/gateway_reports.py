"""What gateways have in flight, and what they saw of each replica's requests: live
telemetry, not events.

Each gateway overwrites its own ``gateway_reports`` row every half second: ``in_flight``
(requests open per replica), ``queued`` (requests it holds waiting for a replica, per
model), ``traffic`` (per replica over the gateway's window: requests, errors, cancels
and latency histograms; ``app.domain.traffic``) and ``ejected`` (the replicas it keeps
out of its rotation for failing, each with its ejections in a row;
``app.gateway.ejection``), and ``routing_position``: the log position of the routing table
it had applied when it counted them. Readers use the rows younger than
``REPORT_MAX_AGE_S``, aged by the database's clock so that no skew between machines
matters; a gateway that stopped, or lost the database, stops counting after that. A gateway
that stops cleanly deletes its row; one whose row is older but not older than
``SILENT_HOLD_S`` is counted as silent (``GatewaysInFlight.silent``), so the reconciler knows
its sums leave some requests out. A row no one has written for ``FORGET_AFTER_S`` is
deleted by the next report of any gateway: a crashed gateway's id (hostname-pid by default)
never writes again, and its row would otherwise stay for ever.

Each row is one gateway process's: ``instance`` is the writing process's token, and a write
overwrites only a row this process wrote (and, as far as it knows, no one wrote since) or
one no gateway has written for ``REPORT_MAX_AGE_S``: a restarted gateway takes back its
previous life's row, but two live processes started with the same id never replace each
other's requests. The second one finds the row held and writes under a key of its own
(``app.gateway.reporter``), so every reader sums both as two gateways.

A row is the writer's word, so a reader takes it as hostile: ``traffic`` is decoded per
replica and ``queued`` per model into bounded types, and a piece that is too big or
malformed is skipped (and logged: each gateway id and part of its row at most once a
``LOG_INTERVAL_S`` a reader, with how many of its refusals went unlogged since, since the
control plane reads the rows several times a second and a bad row stays until its
gateway writes another), never a failure of the reader; ``ejected`` likewise
per replica, and ``traffic.left_out`` (what a report past ``MAX_REPORTED_REPLICAS`` says of
the replicas it leaves out, ``app.domain.traffic_left_out``; absent from an older
gateway's row) as one piece, which, malformed or too big, is read as naming any model
(``traffic_left_out.UNREADABLE``). ``in_flight`` is summed in the database: an entry that
is not a whole count of at most ``MAX_IN_FLIGHT_PER_REPLICA`` is left out of the sums, a
row that is not an object adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Annotated, NamedTuple

import asyncpg
import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.log_throttle import LogThrottle
from app.domain.model_spec import NAME_PATTERN
from app.domain.reports import SILENT_HOLD_S, GatewaysInFlight
from app.domain.traffic import ReplicaTraffic, TrafficFigures, WindowSeconds
from app.domain.traffic_cut import kept_and_left
from app.domain.traffic_left_out import (
    UNREADABLE,
    GatewayTraffic,
    LeftOut,
    figures_of_groups,
    leaving_out,
)
from app.store.database import connection

log = structlog.get_logger(__name__)

REPORT_MAX_AGE_S = 5.0
FORGET_AFTER_S = 3600.0
"""A row no one has written for this long is deleted by any gateway's next report: long
past the age every reader leaves it out at (``SILENT_HOLD_S``), and long enough for an
operator to read a crashed gateway's last report."""
MAX_REPORTED_REPLICAS = 2000
"""A report lists at most this many replicas, those of models in a canary step first, then
the busiest; a reader refuses more. One that
leaves replicas out names the models it heard among them (``left_out``)."""
MAX_REPLICA_TRAFFIC_BYTES = 64 * 1024
"""One replica's figures are three histograms of at most 185 buckets: far below this."""
MAX_REPLICA_ID_CHARS = 256
MAX_REPORTED_MODELS = 2000
"""A report lists the queues of at most this many models, the longest; a reader takes the
first this many of a row that lists more."""
MAX_QUEUED_PER_MODEL = 1_000_000
"""Far above any gateway's queue limit: a count above it is a lie, not a queue."""
MAX_IN_FLIGHT_PER_REPLICA = 1_000_000
"""Far above any engine's concurrency: one gateway's count above it for a replica is a lie,
and is left out of the sums."""
MAX_QUEUED_REPORT_BYTES = 256 * 1024
"""2,000 models of the longest names with their counts fit in less."""
MAX_LEFT_OUT_REPORT_BYTES = 256 * 1024
"""``traffic.left_out`` names at most 2,000 models: far less."""

MAX_EJECTED_IN_A_ROW = 1_000_000
MAX_EJECTED_REPORT_BYTES = 640 * 1024
"""2,000 replicas of the longest ids with their counts fit in less."""

LOG_INTERVAL_S = 60.0
"""A reader logs what it refused of one gateway id's part of a row at most once this often:
it reads the rows several times a second, and a bad row stays until its gateway writes
another."""
MAX_THROTTLED_PARTS = 4096
"""Gateway ids and parts whose last refusal a reader remembers, the longest quiet forgotten
first: a few per gateway of a large fleet, and bounded whatever ids rows claim (one
forgotten is logged again at its next refusal)."""

ReplicaId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REPLICA_ID_CHARS)]
QueuedCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_QUEUED_PER_MODEL)]
EjectionsInARow = Annotated[int, msgspec.Meta(ge=1, le=MAX_EJECTED_IN_A_ROW)]


class TrafficReport(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """``gateway_reports.traffic``: one gateway's window and what it saw per replica."""

    window_s: WindowSeconds
    replicas: Annotated[
        dict[ReplicaId, ReplicaTraffic], msgspec.Meta(max_length=MAX_REPORTED_REPLICAS)
    ]
    left_out: LeftOut | None = None
    """What the window held past the replicas listed (``bounded``); absent when it lists
    every one, as a gateway of an older release always writes it."""


class ReportWritten(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one write of a gateway's report."""

    at: datetime | None
    """The report's time by the database's clock, which the next write passes back; None
    when it was not written: another live process's report holds the row."""
    retired: tuple[str, ...] = ()
    """The keys of the other reports of this gateway's id that were deleted: their
    writers' sessions are gone (previous lives of this gateway)."""
    shared: bool
    """Another process has lately written a report of the gateway this one is named as
    (under its id, or under a key of its own), after this one began writing under the key
    it has now: two live gateways share one id. Each of the two is told."""


class Ejections(msgspec.Struct, frozen=True, kw_only=True):
    """What the live gateways say of ejections: how many of them report ejections at
    all, and how many of those keep each replica out of rotation."""

    gateways: int
    ejected_by: dict[str, int]
    """Replica id -> live gateways that eject it; only replicas some gateway ejects."""


# The row is overwritten only when it is this process's own report, unchanged since its last
# write (a gateway of an older release, started with the same id, writes no token and would
# otherwise go unnoticed), one no gateway has written for the reports' age, or one whose
# writer's session is gone (``_WRITER_GONE``): never another live process's. The row lock ON
# CONFLICT takes decides between two processes that write at once; the loser's update does
# not happen and it is told so (no row written). ``$12``: a previous life's token, which this
# process found holding the row and knows dead (``app.gateway.reporter``): its row is taken
# back at once. ``retired``: the other reports of the gateway named ``$10`` (under that id, or
# under ``$10@token``) whose writers' sessions are gone are deleted: a process of that id
# started again, on another host or under a pid reused since, retires its previous life's
# report at once rather than leave it to count as a silent gateway. A live twin holds its
# session, so neither of two live processes with one id retires the other's. ``aged``: the
# rows of other gateways no one has written for ``$14`` seconds; rows another report is
# deleting or writing now are skipped rather than waited for. ``shared``:
# another process wrote a row of the gateway named ``$10`` after ``$11`` (when this process
# began writing under the key it has now), and lately, and is still connected: each of two
# processes sharing an id finds the other's row.
_WRITER_GONE = """
    {row}.instance IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND objsubid = 2
          AND classid = {lock_class}::oid AND objid = hashtext({row}.instance)::oid)
"""
_OF_THE_GATEWAY = "({row}.gateway_id = $10 OR left({row}.gateway_id, length($10) + 1) = $10 || '@')"

_UPSERT = f"""
WITH retired AS (
    DELETE FROM gateway_reports AS gone
    WHERE {_OF_THE_GATEWAY.format(row="gone")} AND gone.gateway_id <> $1
      AND gone.instance <> $7
      AND {_WRITER_GONE.format(row="gone", lock_class="$13::int")}
    RETURNING gone.gateway_id
), aged AS (
    DELETE FROM gateway_reports AS old
    WHERE old.gateway_id IN (
        SELECT stale.gateway_id FROM gateway_reports AS stale
        WHERE stale.reported_at <= now() - make_interval(secs => $14)
          AND NOT {_OF_THE_GATEWAY.format(row="stale")}
        FOR UPDATE SKIP LOCKED)
), written AS (
    INSERT INTO gateway_reports AS report
        (gateway_id, in_flight, traffic, queued, ejected, routing_position, instance,
         reported_at)
    VALUES ($1, $2::jsonb, $3::jsonb, $4::jsonb, $5::jsonb, $6, $7, now())
    ON CONFLICT (gateway_id) DO UPDATE
    SET in_flight = excluded.in_flight, traffic = excluded.traffic, queued = excluded.queued,
        ejected = excluded.ejected, routing_position = excluded.routing_position,
        instance = excluded.instance, reported_at = now()
    WHERE (report.instance = excluded.instance
           AND ($8::timestamptz IS NULL OR report.reported_at = $8::timestamptz))
       OR report.reported_at <= now() - make_interval(secs => $9)
       OR report.instance = $12
       OR ({_WRITER_GONE.format(row="report", lock_class="$13::int")}
           AND report.instance <> excluded.instance)
    RETURNING report.reported_at
)
SELECT (SELECT reported_at FROM written) AS written_at,
       (SELECT array_agg(gateway_id ORDER BY gateway_id) FROM retired) AS retired,
       EXISTS (SELECT 1 FROM gateway_reports AS other
               WHERE {_OF_THE_GATEWAY.format(row="other")}
                 AND other.gateway_id <> $1
                 AND other.reported_at > $11::timestamptz
                 AND other.reported_at > now() - make_interval(secs => $9)
                 AND NOT ({_WRITER_GONE.format(row="other", lock_class="$13::int")})) AS shared
"""

WRITER_LOCK_CLASS = 1_571_934_201
"""The first key of the session-level advisory lock a gateway's report connection holds
for as long as it is open, the second being ``hashtext(instance)``: a report whose writer
holds none is a gone process's (``_WRITER_GONE``). Two keys, so that it never meets a
single-key lock (the leader's, the log's)."""

_HOLD_WRITER_LOCK = "SELECT pg_try_advisory_lock($1::int, hashtext($2))"


# One statement, so that the counts and the routing tables are of the same rows: a row
# read for its table after another was read for its counts could hide a request sent
# between the two.
# A row is its writer's word (``queued`` below is decoded in Python for the same reason):
# an entry that is not a whole count in bounds is left out here, and a row that is not an
# object adds nothing, so that no gateway's row can make the sum fail (a count that is not
# an integer, or sums past one) and stop every reconcile pass, or take away another
# gateway's requests (a negative count).
_IN_FLIGHT_RECENT = """
WITH live AS (
    SELECT in_flight, routing_position FROM gateway_reports
    WHERE reported_at > now() - make_interval(secs => $1)
)
SELECT count(*) AS gateways, count(routing_position) AS positioned,
       min(routing_position) AS lowest,
       (SELECT count(*) FROM gateway_reports
        WHERE reported_at <= now() - make_interval(secs => $1)
          AND reported_at > now() - make_interval(secs => $2)) AS silent,
       (SELECT coalesce(jsonb_object_agg(replica_id, total), '{}'::jsonb)::text
        FROM (SELECT replica_id, sum(count)::bigint AS total
              FROM (SELECT counts.key AS replica_id,
                           CASE WHEN jsonb_typeof(counts.value) = 'number'
                                THEN counts.value::numeric END AS count
                    FROM live,
                         jsonb_each(CASE WHEN jsonb_typeof(live.in_flight) = 'object'
                                         THEN live.in_flight ELSE '{}'::jsonb END) AS counts
                   ) AS entries
              WHERE count BETWEEN 0 AND $3 AND count = trunc(count)
              GROUP BY replica_id) AS sums) AS in_flight
FROM live
"""

_QUEUED_RECENT = """
SELECT gateway_id, octet_length(queued::text) AS size,
       CASE WHEN octet_length(queued::text) <= $2 THEN queued::text END AS queued
FROM gateway_reports
WHERE reported_at > now() - make_interval(secs => $1) AND queued IS NOT NULL
"""

_EJECTED_RECENT = """
SELECT gateway_id, octet_length(ejected::text) AS size,
       CASE WHEN octet_length(ejected::text) <= $2 THEN ejected::text END AS ejected
FROM gateway_reports
WHERE reported_at > now() - make_interval(secs => $1) AND ejected IS NOT NULL
"""

_SOME_REPLICAS_TRAFFIC = """
SELECT gateway_id, (traffic->'window_s')::text AS window_s,
       (SELECT jsonb_object_agg(id, traffic->'replicas'->id)::text
        FROM unnest($1::text[]) AS id
        WHERE traffic->'replicas' ? id) AS replicas,
       octet_length((traffic->'left_out')::text) AS left_out_size,
       CASE WHEN octet_length((traffic->'left_out')::text) <= $3
            THEN (traffic->'left_out')::text END AS left_out
FROM gateway_reports
WHERE reported_at > now() - make_interval(secs => $2) AND traffic IS NOT NULL
"""

_encoder = msgspec.json.Encoder()
_decode_window = msgspec.json.Decoder(WindowSeconds).decode
_decode_replica = msgspec.json.Decoder(ReplicaTraffic).decode
_decode_left_out = msgspec.json.Decoder(LeftOut | None).decode
_decode_raw_pieces = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_count = msgspec.json.Decoder(QueuedCount).decode
_decode_in_a_row = msgspec.json.Decoder(EjectionsInARow).decode


def bounded(
    report: TrafficReport, most: int = MAX_REPORTED_REPLICAS, first: Collection[str] = frozenset()
) -> TrafficReport:
    """``report`` with at most ``most`` replicas, those in ``first`` (a canary step's:
    ``app.domain.traffic_cut``) and then the busiest, and the models heard among those it
    leaves out (``app.domain.traffic_left_out``): the least used are a lightly used model's,
    which must not look idle for being left out. A report within ``most`` is ``report``."""
    if len(report.replicas) <= most:
        return report
    kept, left = kept_and_left(report.replicas, most, first)
    heard = (replica for replica, seen in left if seen.requests or seen.cancelled)
    return TrafficReport(
        window_s=report.window_s,
        replicas=dict(kept),
        left_out=leaving_out([replica for replica, _ in left], heard, earlier=report.left_out),
    )


def longest_queues(queued: Mapping[str, int]) -> dict[str, int]:
    """The models with requests queued, at most ``MAX_REPORTED_MODELS`` of them (the
    longest queues)."""
    waiting = {model: count for model, count in queued.items() if count > 0}
    if len(waiting) <= MAX_REPORTED_MODELS:
        return waiting
    return dict(sorted(waiting.items(), key=lambda item: item[1])[-MAX_REPORTED_MODELS:])


def some_ejected(ejected: Mapping[str, int]) -> dict[str, int]:
    """At most ``MAX_REPORTED_REPLICAS`` of the ejected replicas (the first by id)."""
    return dict(sorted(ejected.items())[:MAX_REPORTED_REPLICAS])


async def write_report(
    db: asyncpg.Connection,
    gateway_id: str,
    in_flight: dict[str, int],
    *,
    within_s: float,
    instance: str,
    written_at: datetime | None = None,
    named: str | None = None,
    named_since: datetime | None = None,
    traffic: TrafficReport | None = None,
    queued: Mapping[str, int] | None = None,
    ejected: Mapping[str, int] | None = None,
    routing_position: int | None = None,
    taking_over: str | None = None,
) -> ReportWritten:
    """Replace the report under ``gateway_id`` if it is this process's (``instance``; and,
    with ``written_at``, unchanged since the write that set it) or nobody's lately; only
    replicas with requests open are listed in ``in_flight``, only replicas with something
    in the window in ``traffic``, only models with requests waiting in ``queued``, and in
    ``ejected`` the replicas the gateway keeps out of rotation with their ejections in a
    row (None: this gateway does not say); ``routing_position``: the position of the
    routing table the gateway routed by when it counted ``in_flight`` (None: it does not
    say). ``named``, ``named_since``: the id the gateway was given and since when it writes
    under ``gateway_id``: whether another process writes a report of that id lately.
    ``taking_over``: the token of a process known gone whose report may be replaced now."""
    busy = {replica: count for replica, count in in_flight.items() if count > 0}
    figures = None if traffic is None else _encoder.encode(bounded(traffic)).decode()
    waiting = None if queued is None else _encoder.encode(longest_queues(queued)).decode()
    row = await db.fetchrow(
        _UPSERT,
        gateway_id,
        _encoder.encode(busy).decode(),
        figures,
        waiting,
        None if ejected is None else _encoder.encode(some_ejected(ejected)).decode(),
        routing_position,
        instance,
        written_at,
        REPORT_MAX_AGE_S,
        named if named is not None else gateway_id,
        named_since,
        taking_over,
        WRITER_LOCK_CLASS,
        FORGET_AFTER_S,
        timeout=within_s,
    )
    assert row is not None  # a SELECT without FROM: always one row
    return ReportWritten(
        at=row["written_at"], retired=tuple(row["retired"] or ()), shared=row["shared"] is True
    )


async def hold_writer_lock(db: asyncpg.Connection, instance: str, *, within_s: float) -> bool:
    """Take, on ``db``'s session, the lock that says the process whose token is
    ``instance`` writes its report (``WRITER_LOCK_CLASS``); whether it is held now. It is
    let go when the session ends: the process exits, is killed, or loses the connection."""
    held = await db.fetchval(_HOLD_WRITER_LOCK, WRITER_LOCK_CLASS, instance, timeout=within_s)
    return held is True


async def report_holder(db: asyncpg.Connection, gateway_id: str, *, within_s: float) -> str | None:
    """The token of the process that wrote the report under ``gateway_id`` last; None when
    there is none, or a gateway of an older release wrote it."""
    holder = await db.fetchval(
        "SELECT instance FROM gateway_reports WHERE gateway_id = $1", gateway_id, timeout=within_s
    )
    return None if holder is None else str(holder)


async def delete_report(
    db: asyncpg.Connection, gateway_id: str, *, instance: str, within_s: float
) -> None:
    """Remove the report under ``gateway_id`` if this process (``instance``) wrote it last:
    never another live process's."""
    await db.execute(
        "DELETE FROM gateway_reports WHERE gateway_id = $1 AND instance = $2",
        gateway_id,
        instance,
        timeout=within_s,
    )


class TrafficReports:
    """The admin API's reader: a replica's traffic, merged over every live gateway."""

    def __init__(
        self,
        engine: AsyncEngine,
        max_age_s: float = REPORT_MAX_AGE_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: monotonic seconds, by which refusals are logged at most once a
        ``LOG_INTERVAL_S`` per gateway id and part."""
        self._engine = engine
        self._max_age_s = max_age_s
        self._refused = RefusalLog(clock)

    async def replica_traffic(self, replica_id: str) -> TrafficFigures | None:
        """None when no live gateway reports traffic at all; figures of zero requests when
        gateways report and none sent the replica anything in its window."""
        return (await self.traffic_of_groups({replica_id: [replica_id]})).get(replica_id)

    async def traffic_of_groups(
        self, groups: Mapping[str, Collection[str]]
    ) -> dict[str, TrafficFigures]:
        """Each group's replicas' traffic added up (a model's replicas by revision): per
        gateway, what it saw of the group's replicas is one part, so ``gateways`` counts
        gateways, not replicas. Empty when no live gateway reports traffic at all."""
        wanted = sorted({replica for members in groups.values() for replica in members})
        async with connection(self._engine) as db:
            rows = await db.fetch(
                _SOME_REPLICAS_TRAFFIC, wanted, self._max_age_s, MAX_LEFT_OUT_REPORT_BYTES
            )
        seen: list[GatewayTraffic] = []
        for row in rows:
            decoded = _decode_replicas(
                self._refused, row["gateway_id"], row["window_s"], row["replicas"]
            )
            if decoded is not None:
                window_s, parts = decoded
                left_out = _decode_left_out_part(
                    self._refused, row["gateway_id"], row["left_out_size"], row["left_out"]
                )
                seen.append(GatewayTraffic(window_s, parts, left_out))
        return figures_of_groups(groups, seen)

    async def ejections(self) -> Ejections:
        """How many live gateways report ejections, and how many of them eject each
        replica. A row too big, or not an object, is skipped whole (that gateway is not
        counted); an entry that is not a replica id with a count in bounds is skipped alone
        (both logged)."""
        async with connection(self._engine) as db:
            rows = await db.fetch(_EJECTED_RECENT, self._max_age_s, MAX_EJECTED_REPORT_BYTES)
        gateways = 0
        ejected_by: dict[str, int] = {}
        for row in rows:
            ejected = _decode_ejected(self._refused, row["gateway_id"], row["size"], row["ejected"])
            if ejected is None:
                continue
            gateways += 1
            for replica_id in ejected:
                ejected_by[replica_id] = ejected_by.get(replica_id, 0) + 1
        return Ejections(gateways=gateways, ejected_by=ejected_by)


class InFlightReports(TrafficReports):
    """The reconciler's reader: requests in flight per replica and requests queued per
    model, over every live gateway, and (for a rollout's verdicts) the traffic of groups of
    replicas."""

    async def read_in_flight(self) -> dict[str, int]:
        return (await self.read_gateways()).in_flight

    async def read_gateways(self) -> GatewaysInFlight:
        """Requests in flight per replica, and the routing the gateways counted them by."""
        async with connection(self._engine) as db:
            row = await db.fetchrow(
                _IN_FLIGHT_RECENT, self._max_age_s, SILENT_HOLD_S, MAX_IN_FLIGHT_PER_REPLICA
            )
        assert row is not None  # aggregates without GROUP BY: always one row
        totals = msgspec.json.decode(row["in_flight"], type=dict[str, int])
        every_one_says = row["gateways"] > 0 and row["positioned"] == row["gateways"]
        return GatewaysInFlight(
            in_flight={replica: count for replica, count in totals.items() if count > 0},
            routing_seen=row["lowest"] if every_one_says else None,
            live=row["gateways"],
            silent=row["silent"],
        )

    async def read_queued(self) -> dict[str, int]:
        """Requests the live gateways hold waiting for a replica, summed per model; only
        models with some. A row too big, or not an object, is skipped whole; an entry that
        is not a model name with a count in bounds is skipped alone (both logged)."""
        async with connection(self._engine) as db:
            rows = await db.fetch(_QUEUED_RECENT, self._max_age_s, MAX_QUEUED_REPORT_BYTES)
        totals: dict[str, int] = {}
        for row in rows:
            queued = _decode_queued(self._refused, row["gateway_id"], row["size"], row["queued"])
            for model, count in queued.items():
                totals[model] = totals.get(model, 0) + count
        return {model: count for model, count in totals.items() if count > 0}


def _decode_left_out_part(
    refused: RefusalLog, gateway_id: str, size: int | None, document: str | None
) -> LeftOut | None:
    """What a gateway's report says of the replicas it left out; None when it says nothing
    (it left none out, or wrote before reports said so). What it says malformed or too big
    is logged and read as ``UNREADABLE``: it did leave replicas out, and any model may be
    among them. Its listed figures still count."""
    if size is None:
        return None
    try:
        if document is None:
            raise ValueError(f"{size} bytes of left out replicas, over {MAX_LEFT_OUT_REPORT_BYTES}")
        return _decode_left_out(document)
    except (msgspec.DecodeError, ValueError) as exc:
        refused.log(
            gateway_id, "left_out", f"left out replicas unread, any model taken for one: {exc}"
        )
        return UNREADABLE


def _decode_replicas(
    refused: RefusalLog, gateway_id: str, window: str | None, replicas: str | None
) -> tuple[float, dict[str, ReplicaTraffic]] | None:
    """A gateway's window and its figures of the replicas asked for; None (logged) when any
    of it is malformed or too big: the gateway's row is not taken then."""
    try:
        if window is None:
            raise ValueError("no window_s")
        window_s = _decode_window(window)
        raw = _decode_raw_pieces(replicas) if replicas is not None else {}
        parts: dict[str, ReplicaTraffic] = {}
        for replica_id, piece in raw.items():
            if len(piece) > MAX_REPLICA_TRAFFIC_BYTES:
                raise ValueError(f"{len(piece)} bytes of figures for one replica")
            parts[replica_id] = _decode_replica(piece)
    except (msgspec.DecodeError, ValueError) as exc:
        refused.log(gateway_id, "traffic", str(exc))
        return None
    return window_s, parts


class _EntriesPart(NamedTuple):
    """A part of a gateway's row that maps names to counts: what the log calls it and its
    entries, and its bounds."""

    column: str
    name: str
    entries: str
    max_bytes: int
    most: int


_QUEUED = _EntriesPart(
    "queued", "queued counts", "models", MAX_QUEUED_REPORT_BYTES, MAX_REPORTED_MODELS
)
_EJECTED = _EntriesPart(
    "ejected", "ejected replicas", "replicas", MAX_EJECTED_REPORT_BYTES, MAX_REPORTED_REPLICAS
)


def _decode_queued(
    refused: RefusalLog, gateway_id: str, size: int, document: str | None
) -> dict[str, int]:
    """A gateway's queued counts by model: what of it fits (the rest logged, never
    raised)."""
    return _decode_entries(refused, gateway_id, size, document, _QUEUED, _queued_count) or {}


def _decode_ejected(
    refused: RefusalLog, gateway_id: str, size: int, document: str | None
) -> list[str] | None:
    """The replicas a gateway ejects: what of it is well formed (the rest logged, never
    raised); None when the row is not taken at all."""
    ejected = _decode_entries(refused, gateway_id, size, document, _EJECTED, _ejections_in_a_row)
    return None if ejected is None else list(ejected)


def _queued_count(model: str, piece: msgspec.Raw) -> int:
    if not NAME_PATTERN.fullmatch(model):
        raise ValueError("not a model's name")
    return _decode_count(piece)


def _ejections_in_a_row(replica_id: str, piece: msgspec.Raw) -> int:
    if not 1 <= len(replica_id) <= MAX_REPLICA_ID_CHARS:
        raise ValueError("not a replica's id")
    return _decode_in_a_row(piece)


def _decode_entries(
    log_refused: RefusalLog,
    gateway_id: str,
    size: int,
    document: str | None,
    part: _EntriesPart,
    read_entry: Callable[[str, msgspec.Raw], int],
) -> dict[str, int] | None:
    """The entries of one ``part`` of a gateway's row that ``read_entry`` reads, the first
    ``part.most`` of them; None when the row is too big or not an object. What is not taken
    is logged, never raised: a lying row costs only itself."""
    try:
        if document is None:
            raise ValueError(f"{size} bytes of {part.name}, over {part.max_bytes}")
        raw = _decode_raw_pieces(document)
    except (msgspec.DecodeError, ValueError) as exc:
        log_refused.log(gateway_id, part.column, str(exc))
        return None
    taken: dict[str, int] = {}
    refused: list[str] = []
    for key, piece in raw.items():
        if len(taken) == part.most:
            refused.append(f"{part.entries} past the first {part.most}")
            break
        try:
            taken[key] = read_entry(key, piece)
        except (msgspec.DecodeError, ValueError) as exc:
            refused.append(f"{key[:100]!r}: {exc}")
    if refused:
        log_refused.log(
            gateway_id,
            part.column,
            f"{part.name} skipped: {'; '.join(refused[:5])}",
            skipped=len(raw) - len(taken),
        )
    return taken


class RefusalLog:
    """Logs what a reader refused of gateways' rows (``gateway_report_refused``), the
    gateway's id and why both bounded, as a gateway wrote them: each gateway id and part
    at most once a ``LOG_INTERVAL_S``, with how many went unlogged since
    (``refused_unlogged``), and at most ``MAX_THROTTLED_PARTS`` of them remembered,
    whatever ids the rows claim. ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._throttle = LogThrottle(LOG_INTERVAL_S, MAX_THROTTLED_PARTS)

    def log(self, gateway_id: str, part: str, error: str, **counts: int) -> None:
        gateway_id = gateway_id[:200]
        unlogged = self._throttle.admit((gateway_id, part), self._clock())
        if unlogged is None:
            return
        log.warning(
            "gateway_report_refused",
            gateway_id=gateway_id,
            part=part,
            error=error[:500],
            refused_unlogged=unlogged,
            **counts,
        )
