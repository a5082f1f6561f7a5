"""A gateway's database jobs refuse a timing that is not positive, naming it, before they
touch anything: the reporter and the snapshot source judge theirs by the same rule."""

from __future__ import annotations

import re

import pytest

from app.gateway.reporter import GatewayReporter
from app.gateway.source import PostgresSnapshotSource

NEVER_CONNECTED = "postgresql://postgres@127.0.0.1:1/llmgw"


@pytest.mark.parametrize(
    ("interval_s", "timeout_s", "refusal"),
    [
        (0.0, 5.0, "the report interval must be positive, not 0.0"),
        (0.5, -1.0, "the query timeout must be positive, not -1.0"),
    ],
)
def test_a_reporter_refuses_a_timing_that_is_not_positive(
    interval_s: float, timeout_s: float, refusal: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        GatewayReporter(
            NEVER_CONNECTED,
            gateway_id="gw-timings",
            in_flight=dict,
            routing_position=lambda: None,
            report_interval_s=interval_s,
            query_timeout_s=timeout_s,
        )


@pytest.mark.parametrize(
    ("interval_s", "timeout_s", "refusal"),
    [
        (-0.5, 5.0, "the refresh interval must be positive, not -0.5"),
        (5.0, 0.0, "the query timeout must be positive, not 0.0"),
    ],
)
def test_a_snapshot_source_refuses_a_timing_that_is_not_positive(
    interval_s: float, timeout_s: float, refusal: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        PostgresSnapshotSource(
            NEVER_CONNECTED,
            gateway_id="gw-timings",
            refresh_interval_s=interval_s,
            query_timeout_s=timeout_s,
        )
