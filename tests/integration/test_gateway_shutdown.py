"""A gateway told to stop with requests still open, in front of a slow simulator.

Given a stream half relayed and a whole answer still being generated, when the gateway
stops and its graceful shutdown runs out, then the stream ends with an error event that
says why and ``data: [DONE]`` (the ``openai`` SDK raises it as an ``APIError``), the whole
answer is 503 ``gateway_shutting_down`` with ``Retry-After``, each properly framed rather
than a connection cut mid-answer, and the engine aborts both. The whole answer's request
line is a warning that says the grace ran out (requests longer than the grace are worth a
look), not an error: the operator stopped the gateway.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import openai
import pytest
from structlog.testing import capture_logs

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.server import StaticSource
from app.gateway.table import Route
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.timeout(60)

MODEL = f"stopping-{uuid.uuid4().hex[:8]}"
REPLICA = f"{MODEL}-1"
SLOW = ("--decode-base-ms", "40", "--decode-per-seq-ms", "0")
"""40 ms a token: 400 tokens take 16 s, far past the gateway's grace of 1 s."""
LONG = 400
GRACE_S = 1


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with start_simulator("--model", MODEL, *SLOW, port=free_port()) as process:
        process.wait_healthy()
        yield process


def chat(*, stream: bool) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": LONG,
        "stream": stream,
    }


def running(sim: SimulatorProcess) -> float:
    for line in httpx.get(f"{sim.base_url}/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the simulator exports no running count")


def stop_in_the_background(gateway: GatewayThread) -> threading.Thread:
    stopping = threading.Thread(target=gateway.__exit__, args=(None, None, None))
    stopping.start()
    return stopping


def test_requests_open_past_the_grace_are_told_the_gateway_stopped(sim: SimulatorProcess) -> None:
    key, record = new_key()
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url)
    gateway = GatewayThread(
        StaticSource(snapshot_of([route], [record])), graceful_shutdown_s=GRACE_S
    ).__enter__()
    headers = {"authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as http,
        ThreadPoolExecutor(1) as pool,
        http.stream("POST", "/chat/completions", json=chat(stream=True)) as streamed,
    ):
        lines = streamed.iter_lines()
        assert next(lines).startswith("data: {")  # the stream is under way
        whole: Future[httpx.Response] = pool.submit(
            http.post, "/chat/completions", json=chat(stream=False)
        )
        wait_until_blocking(
            lambda: gateway.in_flight()[REPLICA] == 2, what="both requests at the engine"
        )

        stopping = stop_in_the_background(gateway)

        # The stream's end is framed: httpx would raise on a connection cut mid-chunk.
        rest = [line for line in lines if line]
        refused = whole.result(timeout=30)
        stopping.join(timeout=30)

    assert rest[-1] == "data: [DONE]", rest[-3:]
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "gateway_shutting_down", error
    assert "shutting down" in error["message"]
    assert len(rest) < LONG, "the stream ran to its end instead of being cut off"
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "gateway_shutting_down"
    assert refused.headers["retry-after"] == "1"
    # Neither answer goes on being generated for nobody.
    wait_until_blocking(lambda: running(sim) == 0, what="the engine aborting both requests")


def test_the_sdk_raises_the_stopped_stream_as_an_api_error(sim: SimulatorProcess) -> None:
    key, record = new_key()
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url)
    gateway = GatewayThread(
        StaticSource(snapshot_of([route], [record])), graceful_shutdown_s=GRACE_S
    ).__enter__()
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    chunks = client.chat.completions.create(**chat(stream=True))  # type: ignore[call-overload]
    assert next(chunks).choices  # the stream is under way
    stopping = stop_in_the_background(gateway)

    with pytest.raises(openai.APIError, match="This gateway is shutting down") as raised:
        list(chunks)

    stopping.join(timeout=30)
    assert raised.value.code == "gateway_shutting_down"


def test_a_request_unanswered_when_the_grace_runs_out_is_logged_at_warning_saying_so(
    sim: SimulatorProcess,
) -> None:
    key, record = new_key()
    route = Route(replica_id=REPLICA, model=MODEL, url=sim.base_url)
    gateway = GatewayThread(
        StaticSource(snapshot_of([route], [record])), graceful_shutdown_s=GRACE_S, log_requests=True
    ).__enter__()
    headers = {"authorization": f"Bearer {key}"}
    with (
        capture_logs() as logs,
        httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as http,
        ThreadPoolExecutor(1) as pool,
    ):
        whole = pool.submit(http.post, "/chat/completions", json=chat(stream=False))
        wait_until_blocking(
            lambda: gateway.in_flight().get(REPLICA) == 1, what="the request at the engine"
        )
        gateway.__exit__(None, None, None)
        refused = whole.result(timeout=30)

    [line] = [entry for entry in logs if entry["event"] == "gateway_request"]
    assert (line["log_level"], line["model"], line["status"]) == ("warning", MODEL, 503)
    assert line["note"] == "still unanswered when the gateway's shutdown grace ran out"
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["message"] == (
        "This gateway is shutting down and could not answer the request in time; retry after "
        "1 s: another gateway will answer."
    )
