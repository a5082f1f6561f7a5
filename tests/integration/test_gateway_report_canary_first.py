"""A crowded gateway in front of a model in a rollout's canary step: its window holds more
replicas than a report lists, every one of another model busier than the canary model's
quietest. Its report, written to PostgreSQL by the gateway's reporter as a gateway writes
it, keeps the canary model's replicas first and leaves out only the other model's quietest:
the verdict's reader finds both sides of the rollout whole (``unlisted`` 0), where a report
kept by traffic alone would leave out the canary model's quiet replicas and hold the
rollout at every step for an operator."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.rollout_reads import canary_group, stable_group
from app.domain.traffic import Outcome
from app.gateway.server import Gateway, StaticSource
from app.gateway.table import Canary, GatewaySnapshot, Route
from app.store.gateway_reports import MAX_REPORTED_REPLICAS, TrafficReports
from tests.support.reporting_gateway import reporting_gateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

STABLE, NEW = 1, 2


def in_canary_step(model: str, busy: str) -> GatewaySnapshot:
    """``model`` in a canary step of revision 2, on replicas 1 and 2 of revision 1 and 3 and
    4 of revision 2; ``busy``'s replicas serve beside it."""
    routes = tuple(
        Route(
            replica_id=f"{model}-{number}",
            model=model,
            url=f"http://127.0.0.1:{8000 + number}",
            revision=STABLE if number <= 2 else NEW,
        )
        for number in range(1, 5)
    )
    crowd = tuple(
        Route(replica_id=f"{busy}-{number}", model=busy, url=f"http://127.0.0.1:{9000 + number}")
        for number in range(MAX_REPORTED_REPLICAS)
    )
    return GatewaySnapshot(
        declared=frozenset({model, busy}),
        routes={model: routes, busy: crowd},
        canaries={model: Canary(revision=NEW, share=0.5)},
    )


def served(gateway: Gateway, replica_id: str, requests: int) -> None:
    for _ in range(requests):
        gateway.traffic.record(replica_id, Outcome.ANSWERED, latency_s=0.05)


async def test_a_crowded_report_lists_the_replicas_of_a_model_in_a_canary_step_whole(
    engine: AsyncEngine, database_url: str
) -> None:
    model, busy = f"m-{uuid.uuid4().hex[:6]}", f"busy-{uuid.uuid4().hex[:6]}"
    gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
    gateway = Gateway(StaticSource(in_canary_step(model, busy)), host="127.0.0.1", port=0)
    for number in range(MAX_REPORTED_REPLICAS):
        served(gateway, f"{busy}-{number}", 2)
    # Each side has one replica busier than the crowd and one quieter.
    served(gateway, f"{model}-1", 3)
    served(gateway, f"{model}-2", 1)
    served(gateway, f"{model}-3", 3)
    served(gateway, f"{model}-4", 1)
    assert len(gateway.traffic.report()) == MAX_REPORTED_REPLICAS + 4

    async def report_row() -> tuple[list[str], int] | None:
        """The models the gateway's report names among those it left out, and how many
        replicas it lists; None before it wrote one."""
        async with engine.connect() as db:
            row = (
                await db.execute(
                    text(
                        "SELECT traffic->'left_out'->'models' AS models,"
                        " (SELECT count(*) FROM jsonb_object_keys(traffic->'replicas')) AS listed"
                        " FROM gateway_reports WHERE gateway_id = :gateway_id"
                    ),
                    {"gateway_id": gateway_id},
                )
            ).first()
        return None if row is None or row.models is None else (sorted(row.models), row.listed)

    async def reported() -> bool:
        return await report_row() is not None

    reporter = await reporting_gateway(
        database_url, gateway_id, dict, traffic=gateway.traffic_report, report_interval_s=0.1
    )
    try:
        await wait_until(reported, what="the gateway's cut report written")
        written = await report_row()
        figures = await TrafficReports(engine).traffic_of_groups(
            {
                canary_group(model): [f"{model}-3", f"{model}-4"],
                stable_group(model): [f"{model}-1", f"{model}-2"],
            }
        )
    finally:
        await reporter.close()

    for side in (canary_group(model), stable_group(model)):
        assert figures[side].unlisted == 0, side
        assert figures[side].requests == 4, side
    assert written == ([busy], MAX_REPORTED_REPLICAS)
