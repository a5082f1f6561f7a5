"""What gateways report of ejections, through PostgreSQL: written with the in-flight report,
counted over the fresh rows, and taken as hostile (a lying row costs only itself)."""

from __future__ import annotations

import json

from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.store.database import connection
from app.store.gateway_reports import (
    MAX_EJECTED_REPORT_BYTES,
    MAX_REPORTED_REPLICAS,
    Ejections,
    TrafficReports,
    write_report,
)


async def test_the_gateways_that_eject_a_replica_are_counted_over_fresh_reports(
    engine: AsyncEngine,
) -> None:
    async with connection(engine) as db:
        await write_report(
            db, "gw-a", {"r-1": 2}, within_s=5.0, instance="test", ejected={"r-1": 1, "r-2": 3}
        )
        await write_report(db, "gw-b", {}, within_s=5.0, instance="test", ejected={"r-1": 2})
        await write_report(db, "gw-c", {}, within_s=5.0, instance="test", ejected={})
        await write_report(
            db, "legacy", {}, within_s=5.0, instance="test"
        )  # predates ejections: says nothing
        await write_report(db, "gone", {}, within_s=5.0, instance="test", ejected={"r-3": 1})
        await db.execute(
            "UPDATE gateway_reports SET reported_at = now() - interval '1 minute' "
            "WHERE gateway_id = 'gone'"
        )
    reader = TrafficReports(engine)

    assert await reader.ejections() == Ejections(gateways=3, ejected_by={"r-1": 2, "r-2": 1})

    async with connection(engine) as db:  # gw-a returned r-1 to rotation
        await write_report(db, "gw-a", {}, within_s=5.0, instance="test", ejected={"r-2": 3})
    assert await reader.ejections() == Ejections(gateways=3, ejected_by={"r-1": 1, "r-2": 1})


async def test_a_report_ejects_at_most_the_bounded_number_of_replicas(engine: AsyncEngine) -> None:
    many = {f"r-{n:05d}": 1 for n in range(MAX_REPORTED_REPLICAS + 10)}
    async with connection(engine) as db:
        await write_report(db, "gw-a", {}, within_s=5.0, instance="test", ejected=many)
    found = await TrafficReports(engine).ejections()
    assert (found.gateways, len(found.ejected_by)) == (1, MAX_REPORTED_REPLICAS)


async def test_a_malformed_ejection_report_is_skipped_and_the_others_still_count(
    engine: AsyncEngine,
) -> None:
    huge = json.dumps({"r-1": 1, "padding": "x" * MAX_EJECTED_REPORT_BYTES})
    rows = [
        ("good", '{"r-1": 1}'),
        ("array", '["r-1", "r-2"]'),
        ("scalar", '"r-1"'),
        ("huge", huge),
        ("mixed", '{"r-1": 2, "r-2": "soon", "r-3": 0, "": 1, "r-4": -1}'),
        ("long-id", json.dumps({"r" * 300: 1, "r-2": 1})),
    ]
    async with connection(engine) as db:
        for gateway_id, ejected in rows:
            await db.execute(
                "INSERT INTO gateway_reports (gateway_id, in_flight, ejected) "
                "VALUES ($1, '{}'::jsonb, $2::jsonb)",
                gateway_id,
                ejected,
            )
    with capture_logs() as logs:
        found = await TrafficReports(engine).ejections()

    # good, mixed (its one good entry) and long-id (its r-2); the others are not taken.
    assert found == Ejections(gateways=3, ejected_by={"r-1": 2, "r-2": 1})
    refused = sorted(e["gateway_id"] for e in logs if e["event"] == "gateway_report_refused")
    assert refused == ["array", "huge", "long-id", "mixed", "scalar"]
    said = {e["gateway_id"]: e for e in logs if e["event"] == "gateway_report_refused"}
    assert said["huge"]["error"].endswith(
        f" bytes of ejected replicas, over {MAX_EJECTED_REPORT_BYTES}"
    )
    assert said["mixed"]["skipped"] == 4
    assert said["mixed"]["error"] == (
        "ejected replicas skipped: '': not a replica's id; 'r-2': Expected `int`, got `str`; "
        "'r-3': Expected `int` >= 1; 'r-4': Expected `int` >= 1"
    )
    long_id = repr("r" * 100)
    assert said["long-id"]["error"] == f"ejected replicas skipped: {long_id}: not a replica's id"


async def test_a_report_past_the_bounded_number_of_replicas_says_how_many_were_skipped(
    engine: AsyncEngine,
) -> None:
    many = {f"r-{n:05d}": 1 for n in range(MAX_REPORTED_REPLICAS + 10)}
    async with connection(engine) as db:
        await write_report(db, "gw-a", {}, within_s=5.0, instance="test", ejected=many)
        await db.execute(
            "UPDATE gateway_reports SET ejected = $1::jsonb WHERE gateway_id = 'gw-a'",
            json.dumps(many),
        )
    with capture_logs() as logs:
        found = await TrafficReports(engine).ejections()

    assert len(found.ejected_by) == MAX_REPORTED_REPLICAS
    [refusal] = [e for e in logs if e["event"] == "gateway_report_refused"]
    assert refusal["error"] == (
        f"ejected replicas skipped: replicas past the first {MAX_REPORTED_REPLICAS}"
    )
    assert refusal["skipped"] == 10
