"""A request whose client leaves before any of the answer came is counted apart from other
cancels (abandoned): the clients of a replica that hangs give up so, and a rollout's verdict
counts those against the replica."""

from __future__ import annotations

import asyncio
from typing import cast

import msgspec
import pytest

from app.domain.traffic import Outcome, ReplicaTraffic
from app.gateway.engine_answer import EngineAnswer
from app.gateway.engine_client import EngineClient
from app.gateway.proxy import Timing, Upstream
from app.gateway.traffic import TrafficWindow
from tests.unit.test_gateway_router import key, route, router_with


class HangingEngine:
    """An engine that takes the request and sends nothing back, not even a head."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def post(self, base_url: str, path: str, body: bytes, request_id: str) -> EngineAnswer:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable: the request is cancelled first")


async def test_a_client_leaving_a_replica_that_sent_no_head_is_counted_abandoned() -> None:
    engine = HangingEngine()
    window = TrafficWindow()
    upstream = Upstream(router_with(route("r-1")), cast(EngineClient, engine), traffic=window)
    request = asyncio.create_task(
        upstream.open("m", key(), "/v1/chat/completions", b"{}", "req-1", Timing(0.0))
    )
    await engine.asked.wait()

    request.cancel()
    await asyncio.gather(request, return_exceptions=True)

    assert window.report()["r-1"] == ReplicaTraffic(cancelled=1, abandoned=1)


def test_abandoned_requests_are_cancelled_ones_and_neither_requests_nor_errors() -> None:
    window = TrafficWindow()
    window.record("r-1", Outcome.ABANDONED)
    window.record("r-1", Outcome.CANCELLED)
    window.record("r-1", Outcome.ANSWERED)

    assert window.report()["r-1"] == ReplicaTraffic(requests=1, cancelled=2, abandoned=1)


def test_a_report_of_more_abandoned_than_cancelled_requests_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="2 abandoned of only 1 cancelled"):
        msgspec.json.decode(b'{"cancelled": 1, "abandoned": 2}', type=ReplicaTraffic)
