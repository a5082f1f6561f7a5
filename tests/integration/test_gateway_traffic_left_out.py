"""What a report past its replicas says of those it left out is read as its writer's word:
a malformed or oversized ``left_out`` is logged and read as naming no model it can be sure
of (any model may be among those left out, so none is taken for idle for it), the figures
the report lists still count, and a report without one (an older gateway's) reads as
before."""

from __future__ import annotations

import uuid

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.store.database import connection
from app.store.gateway_reports import MAX_LEFT_OUT_REPORT_BYTES, TrafficReports


async def test_a_bad_left_out_part_costs_only_itself_and_hides_no_model(
    engine: AsyncEngine,
) -> None:
    quiet, other = f"q-{uuid.uuid4().hex[:6]}", f"o-{uuid.uuid4().hex[:6]}"
    replicas = {f"{quiet}-1": {"requests": 2}}
    too_long = [f"m{n}-{'x' * 60}" for n in range(MAX_LEFT_OUT_REPORT_BYTES // 60)]
    tag = uuid.uuid4().hex[:6]
    rows = {
        f"names-it-{tag}": {"left_out": {"replicas": 1, "models": [quiet]}},
        f"names-another-{tag}": {"left_out": {"replicas": 1, "models": [other]}},
        f"older-{tag}": {},
        f"bad-name-{tag}": {"left_out": {"replicas": 1, "models": ["Not A Name"]}},
        f"oversized-{tag}": {"left_out": {"replicas": 1, "models": too_long}},
    }
    async with connection(engine) as db:
        for gateway_id, part in rows.items():
            traffic = {"window_s": 60, "replicas": replicas} | part
            await db.execute(
                "INSERT INTO gateway_reports (gateway_id, in_flight, traffic) "
                "VALUES ($1, '{}'::jsonb, $2::jsonb)",
                gateway_id,
                msgspec.json.encode(traffic).decode(),
            )

    try:
        with capture_logs() as logs:
            figures = await TrafficReports(engine).traffic_of_groups(
                {"listed": [f"{quiet}-1"], "quiet": [f"{quiet}-2"]}
            )
    finally:  # gone, as their gateways stopped: no other story reads them as live
        async with connection(engine) as db:
            await db.execute(
                "DELETE FROM gateway_reports WHERE gateway_id = ANY($1::text[])", list(rows)
            )

    assert figures["listed"].requests == 2 * len(rows)
    assert figures["listed"].unlisted == 0
    assert figures["quiet"].requests == 0
    # The gateway that names it, and the two whose left_out cannot be read: it may be there.
    assert figures["quiet"].unlisted == 3
    refused = {e["gateway_id"]: e["error"] for e in logs if e["event"] == "gateway_report_refused"}
    assert set(refused) == {f"bad-name-{tag}", f"oversized-{tag}"}
    assert refused[f"oversized-{tag}"].startswith(
        "left out replicas unread, any model taken for one: "
    )
    assert f"over {MAX_LEFT_OUT_REPORT_BYTES}" in refused[f"oversized-{tag}"]
