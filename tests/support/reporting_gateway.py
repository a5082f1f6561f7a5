"""A gateway's database side without its listeners: the snapshot source it routes by and the
reporter that writes what it has open, started together, reporting what the test sets."""

from __future__ import annotations

from dataclasses import dataclass

from app.gateway.reporter import (
    DEFAULT_REPORT_INTERVAL_S,
    GatewayReporter,
    InFlightCounter,
    QueuedCounter,
    TrafficReader,
)
from app.gateway.source import PostgresSnapshotSource


@dataclass(frozen=True)
class ReportingGateway:
    source: PostgresSnapshotSource
    reporter: GatewayReporter

    async def close(self) -> None:
        """Stop as a gateway stops: its report removed, then its source closed."""
        try:
            await self.reporter.close()
        finally:
            await self.source.close()


async def reporting_gateway(
    database_url: str,
    gateway_id: str,
    in_flight: InFlightCounter,
    *,
    queued: QueuedCounter | None = None,
    traffic: TrafficReader | None = None,
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
    refresh_interval_s: float | None = None,
) -> ReportingGateway:
    """Started (the caller closes it): it reports ``in_flight()``, ``queued()`` and
    ``traffic()`` with the position of the routing table its source has read."""
    source = (
        PostgresSnapshotSource(database_url, gateway_id=gateway_id)
        if refresh_interval_s is None
        else PostgresSnapshotSource(
            database_url, gateway_id=gateway_id, refresh_interval_s=refresh_interval_s
        )
    )
    reporter = GatewayReporter(
        database_url,
        gateway_id=gateway_id,
        in_flight=in_flight,
        routing_position=source.routing_position,
        queued=queued,
        traffic=traffic,
        report_interval_s=report_interval_s,
    )
    await source.start()
    await reporter.start()
    return ReportingGateway(source, reporter)
