"""A gateway's report row that the readers refuse is logged, but not at every read: the
control plane reads the rows several times a second, and one bad or hostile row would
otherwise write a warning a read for as long as it stays. Each gateway id and part of its
row is logged at most once a minute, with how many of its refusals went unlogged since.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.store.database import connection
from app.store.gateway_reports import InFlightReports

READS = 5


async def insert_row(engine: AsyncEngine, gateway_id: str, queued: str, ejected: str) -> None:
    async with connection(engine) as db:
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, queued, ejected) "
            "VALUES ($1, '{}'::jsonb, $2::jsonb, $3::jsonb)",
            gateway_id,
            queued,
            ejected,
        )


async def delete_rows(engine: AsyncEngine, *gateway_ids: str) -> None:
    """Gone, as their gateways stopped: no other story reads them as live."""
    async with connection(engine) as db:
        await db.execute(
            "DELETE FROM gateway_reports WHERE gateway_id = ANY($1::text[])", list(gateway_ids)
        )


def refusals(logs: list[dict[str, Any]], gateway_id: str) -> list[dict[str, Any]]:
    return [
        e for e in logs if e["event"] == "gateway_report_refused" and e["gateway_id"] == gateway_id
    ]


async def test_a_bad_row_read_again_and_again_is_logged_once_a_part_a_minute(
    engine: AsyncEngine,
) -> None:
    hostile, other = f"hostile-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    await insert_row(engine, hostile, '["llama"]', '{"r-1": "soon"}')
    await insert_row(engine, other, '{"Not A Model!": 1}', "{}")
    reports = InFlightReports(engine)
    try:
        with capture_logs() as logs:
            for _ in range(READS):
                await reports.read_queued()
                await reports.ejections()
    finally:
        await delete_rows(engine, hostile, other)

    said = refusals(logs, hostile)
    assert len(said) == 2  # one for each part refused, not one a read
    assert sorted(e["part"] for e in said) == ["ejected", "queued"]
    assert all(e["refused_unlogged"] == 0 for e in said)
    # Another gateway's refusal is its own: not hidden by the first's.
    [line] = refusals(logs, other)
    assert (line["part"], line["skipped"]) == ("queued", 1)


async def test_a_minute_later_the_line_says_how_many_went_unlogged(engine: AsyncEngine) -> None:
    hostile = f"hostile-{uuid.uuid4().hex[:6]}"
    await insert_row(engine, hostile, '["llama"]', "{}")
    now = [1_000.0]
    reports = InFlightReports(engine, clock=lambda: now[0])
    try:
        with capture_logs() as logs:
            for _ in range(READS):
                await reports.read_queued()
            now[0] += 59.0
            await reports.read_queued()
            now[0] += 1.0
            await reports.read_queued()
    finally:
        await delete_rows(engine, hostile)

    first, later = refusals(logs, hostile)
    assert (first["part"], first["refused_unlogged"]) == ("queued", 0)
    assert (later["part"], later["refused_unlogged"]) == ("queued", READS)
    assert later["error"] == first["error"]
