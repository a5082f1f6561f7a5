"""What gateways have in flight, by replica: live telemetry, not events.

Each gateway overwrites its own ``gateway_reports`` row every half second. The reconciler
sums the rows younger than ``REPORT_MAX_AGE_S``, aged by the database's clock so that no
skew between machines matters; a gateway that stopped, or lost the database, stops
counting after that.
"""

from __future__ import annotations

import asyncpg
import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import connection

REPORT_MAX_AGE_S = 5.0

_UPSERT = """
INSERT INTO gateway_reports (gateway_id, in_flight, reported_at) VALUES ($1, $2::jsonb, now())
ON CONFLICT (gateway_id) DO UPDATE SET in_flight = excluded.in_flight, reported_at = now()
"""
_SUM_RECENT = """
SELECT counts.key AS replica_id, sum(counts.value::int)::int AS in_flight
FROM gateway_reports, jsonb_each_text(gateway_reports.in_flight) AS counts
WHERE gateway_reports.reported_at > now() - make_interval(secs => $1)
GROUP BY counts.key
"""
_encoder = msgspec.json.Encoder()


async def write_report(
    db: asyncpg.Connection, gateway_id: str, in_flight: dict[str, int], *, within_s: float
) -> None:
    """Replace ``gateway_id``'s report; only replicas with requests open are listed."""
    busy = {replica: count for replica, count in in_flight.items() if count > 0}
    await db.execute(_UPSERT, gateway_id, _encoder.encode(busy).decode(), timeout=within_s)


async def delete_report(db: asyncpg.Connection, gateway_id: str, *, within_s: float) -> None:
    await db.execute(
        "DELETE FROM gateway_reports WHERE gateway_id = $1", gateway_id, timeout=within_s
    )


class InFlightReports:
    """The reconciler's reader: requests in flight per replica, over every live gateway."""

    def __init__(self, engine: AsyncEngine, max_age_s: float = REPORT_MAX_AGE_S) -> None:
        self._engine = engine
        self._max_age_s = max_age_s

    async def read_in_flight(self) -> dict[str, int]:
        async with connection(self._engine) as db:
            rows = await db.fetch(_SUM_RECENT, self._max_age_s)
        return {row["replica_id"]: row["in_flight"] for row in rows if row["in_flight"] > 0}
