"""Streams cut off mid-way are the operator's to see, though their answers began as 200.

A real gateway (its own loop and server) streams from the engine simulator. Given a stream
under way, when the simulator is killed (SIGKILL), or when the gateway stops and its
shutdown grace runs out, then the client gets the error event and ``data: [DONE]`` as
before, and the gateway logs a warning naming the model, the replica and why, and counts
the stream on ``/metrics`` by model and reason: the request's own line and its count read
as a plain 200, which an operator at info level never saw.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.server import StaticSource
from app.gateway.table import Route
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.timeout(60)

MODEL = f"cut-{uuid.uuid4().hex[:8]}"
REPLICA = f"{MODEL}-1"
SLOW = ("--decode-base-ms", "40", "--decode-per-seq-ms", "0")
"""40 ms a token: 400 tokens take 16 s, far past what the test waits."""
LONG = 400
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": LONG,
    "stream": True,
}


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, *SLOW, port=free_port()) as process:
        process.wait_healthy()
        yield process


def cut_counted(page: str, reason: str) -> float:
    """``llmgw_gateway_streams_cut_total`` of MODEL for ``reason`` on a /metrics page."""
    line = f'llmgw_gateway_streams_cut_total{{model="{MODEL}",reason="{reason}"}} '
    return next(
        (float(row.removeprefix(line)) for row in page.splitlines() if row.startswith(line)), 0
    )


def cut_warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "stream_cut_off"]


def rest_of_stream(gateway: GatewayThread, key: str, cut: Any) -> list[str]:
    """Open a stream, call ``cut()`` once its first event is in, and read what follows."""
    headers = {"authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as http,
        http.stream("POST", "/chat/completions", json=CHAT) as streamed,
    ):
        assert streamed.status_code == 200
        lines = streamed.iter_lines()
        assert next(lines).startswith("data: {")  # the stream is under way
        cut()
        return [line for line in lines if line]


def test_a_stream_whose_engine_is_killed_is_logged_as_a_warning_and_counted(
    sim: SimulatorProcess,
) -> None:
    key, record = new_key()
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url)
    with (
        GatewayThread(StaticSource(snapshot_of([route], [record])), metrics_port=0) as gateway,
        capture_logs() as logs,
    ):
        rest = rest_of_stream(gateway, key, sim.process.kill)

        assert rest[-1] == "data: [DONE]", rest[-3:]
        error = json.loads(rest[-2].removeprefix("data: "))["error"]
        assert error["code"] == "upstream_disconnected", error
        wait_until_blocking(
            lambda: cut_counted(httpx.get(gateway.metrics_url).text, "broken") == 1,
            what="the cut stream counted on /metrics",
        )

    [warning] = cut_warnings(logs)
    assert warning["log_level"] == "warning"
    assert (warning["model"], warning["replica_id"], warning["reason"]) == (
        MODEL,
        REPLICA,
        "broken",
    )
    assert warning["detail"], "the warning says what broke"


def test_a_stream_cut_off_by_a_stopping_gateway_is_logged_as_a_warning_and_counted(
    sim: SimulatorProcess,
) -> None:
    key, record = new_key()
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url)
    gateway = GatewayThread(
        StaticSource(snapshot_of([route], [record])), graceful_shutdown_s=0
    ).__enter__()
    stopping = threading.Thread(target=gateway.__exit__, args=(None, None, None))
    with capture_logs() as logs:
        rest = rest_of_stream(gateway, key, stopping.start)
        stopping.join(timeout=30)

    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "gateway_shutting_down", error
    assert cut_counted(gateway.gateway.metrics.render().decode(), "gateway_stopping") == 1
    [warning] = cut_warnings(logs)
    assert warning["log_level"] == "warning"
    assert (warning["model"], warning["replica_id"], warning["reason"]) == (
        MODEL,
        REPLICA,
        "gateway_stopping",
    )
