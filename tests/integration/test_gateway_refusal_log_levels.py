"""A 503 that autoscaling or an operator means is logged as what happened, not as a fault.

Given a real gateway logging its requests, a model its operator scaled to zero, a model
starting from zero that no replica serves within its cold-start timeout, and a declared
model that simply has no replica: the first two answer 503 as they always did, and their
request lines say so below error level (what happened is the model's state, not the
gateway's or an engine's fault); the third is still an error. A model failing to start is
an error too, and its client is told what failed in the control plane's words. A request
held for a cold start when its gateway is told to stop is turned away at info (the
operator stopped it), told to retry, since another gateway answers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec
import pytest
from structlog.testing import capture_logs

from app.gateway.server import StaticSource
from app.gateway.table import StartFailure
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.timeout(60)

RUN = uuid.uuid4().hex[:8]
ASLEEP = f"asleep-{RUN}"
"""Scaled to zero by its operator: refused at once."""
WAKING = f"waking-{RUN}"
"""Starting from zero: held for its cold-start timeout, which passes with no replica."""
IDLE = f"idle-{RUN}"
"""Declared, without a replica or an autoscaling policy."""
FAILING = f"failing-{RUN}"
"""In failure backoff after 3 failures in a row, with no replica starting."""
COLD_START_S = 0.2
BACKOFF_S = 600.0


@pytest.fixture(scope="module")
def key_and_gateway() -> Iterator[tuple[str, GatewayThread]]:
    key, record = new_key()
    snapshot = msgspec.structs.replace(
        snapshot_of([], [record], frozenset({ASLEEP, WAKING, IDLE, FAILING})),
        cold_start_s={WAKING: COLD_START_S},
        scaled_to_zero=frozenset({ASLEEP}),
        start_failures={FAILING: StartFailure(failures=3, retry_at=time.monotonic() + BACKOFF_S)},
    )
    with GatewayThread(StaticSource(snapshot), log_requests=True) as gateway:
        yield key, gateway


def chat(key_and_gateway: tuple[str, GatewayThread], model: str) -> httpx.Response:
    key, gateway = key_and_gateway
    return httpx.post(
        f"{gateway.url}/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30.0,
    )


def refusal(
    key_and_gateway: tuple[str, GatewayThread], model: str
) -> tuple[httpx.Response, dict[str, object]]:
    """One chat request for ``model``, which is answered 503, and its request line."""
    with capture_logs() as logs:
        answer = chat(key_and_gateway, model)
    assert answer.status_code == 503, answer.text
    [line] = [entry for entry in logs if entry["event"] == "gateway_request"]
    return answer, line


def request_line(key_and_gateway: tuple[str, GatewayThread], model: str) -> dict[str, object]:
    """The request line of one chat request for ``model``, which is answered 503."""
    return refusal(key_and_gateway, model)[1]


def test_a_model_scaled_to_zero_is_logged_at_info_saying_so(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    line = request_line(key_and_gateway, ASLEEP)
    assert (line["log_level"], line["model"], line["status"]) == ("info", ASLEEP, 503)
    assert line["note"] == "the model is scaled to zero by its operator"


def test_a_cold_start_that_times_out_is_logged_at_warning_saying_so(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    line = request_line(key_and_gateway, WAKING)
    assert (line["log_level"], line["model"], line["status"]) == ("warning", WAKING, 503)
    assert line["note"] == (
        f"held for the model's cold start, which served no replica within {COLD_START_S:g} s"
    )


def test_a_model_without_a_replica_or_a_policy_is_still_an_error(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    line = request_line(key_and_gateway, IDLE)
    assert (line["log_level"], line["model"], line["status"]) == ("error", IDLE, 503)


def test_a_model_failing_to_start_is_an_error_told_in_the_control_planes_words(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    # Before, "(its last 3 replicas failed)": the count also takes in engines that crashed
    # soon after they served, as `llmgw-cli model` says.
    answer, line = refusal(key_and_gateway, FAILING)
    counted = (
        "3 failures in a row (starts that failed or engines that crashed within 60s of serving)"
    )
    message = answer.json()["error"]["message"]
    assert message.startswith(f"The model `{FAILING}` is failing to start: {counted}; "), message
    assert (line["log_level"], line["model"], line["status"]) == ("error", FAILING, 503)
    assert line["note"] == f"the model is failing to start: {counted}"


def test_a_request_held_for_a_cold_start_as_the_gateway_stops_is_logged_at_info_saying_so() -> None:
    """Its gateway was stopped by its operator: no fault, and its client goes elsewhere."""
    key, record = new_key()
    snapshot = msgspec.structs.replace(
        snapshot_of([], [record], frozenset({WAKING})), cold_start_s={WAKING: 3600.0}
    )
    gateway = GatewayThread(StaticSource(snapshot), log_requests=True).__enter__()
    with capture_logs() as logs, ThreadPoolExecutor(1) as pool:
        held = pool.submit(chat, (key, gateway), WAKING)
        wait_until_blocking(
            lambda: gateway.call(gateway.gateway.queued) == {WAKING: 1}, what="the request held"
        )
        gateway.__exit__(None, None, None)
        answer = held.result(timeout=30)

    [line] = [entry for entry in logs if entry["event"] == "gateway_request"]
    assert (line["log_level"], line["model"], line["status"]) == ("info", WAKING, 503)
    assert line["note"] == "held for the model's cold start when the gateway began stopping"
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "1"
    error = answer.json()["error"]
    assert (error["code"], error["message"]) == (
        "gateway_shutting_down",
        f"The model `{WAKING}` is starting from zero and this gateway is shutting down; "
        "retry after 1 s: another gateway will answer.",
    )
