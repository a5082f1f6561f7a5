"""Hostile clients at a real gateway (uvicorn on a loopback socket, its own loop in a thread).

What an attacker sends (JSON nested a thousand deep, one wrong key after another, a scrape
of ``/metrics``) gets an OpenAI-shaped answer that costs only that client, and the gateway
keeps serving everyone else.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.gateway.server import StaticSource
from tests.support.gateway import GatewayThread, new_key, snapshot_of

pytestmark = pytest.mark.timeout(60)

MODEL = "hostile-model"
"""Declared without a replica: requests that get past parsing are answered 503."""


@pytest.fixture(scope="module")
def key_and_gateway() -> Iterator[tuple[str, GatewayThread]]:
    key, record = new_key()
    snapshot = snapshot_of([], [record], frozenset({MODEL}))
    with GatewayThread(StaticSource(snapshot)) as gateway:
        yield key, gateway


@pytest.fixture
def client(key_and_gateway: tuple[str, GatewayThread]) -> Iterator[httpx.Client]:
    key, gateway = key_and_gateway
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}) as client:
        yield client


# -- JSON nested deeper than the gateway reads --------------------------------------------


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_json_nested_thousands_deep_is_a_400_in_openais_shape(
    client: httpx.Client, path: str, depth: int
) -> None:
    body = f'{{"model": "{MODEL}", "messages": {"[" * depth}{"]" * depth}}}'

    answer = client.post(path, content=body, headers={"content-type": "application/json"})

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "nests arrays and objects too deeply" in error["message"]
    assert answer.headers["x-request-id"].startswith("req_")
    # The gateway is unharmed: the next request is routed as usual.
    after = client.post(path, json={"model": MODEL, "prompt": "hi"})
    assert after.status_code == 503, after.text
    assert after.json()["error"]["code"] == "no_serving_replica"


# -- /metrics names every model and replica: never on the client listener ------------------


def test_the_client_listener_answers_404_for_metrics(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    _, gateway = key_and_gateway

    answer = httpx.get(f"{gateway.base_url}/metrics")

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"
    assert gateway.gateway.metrics_url is None


def test_a_standalone_gateway_serves_metrics_on_a_listener_of_its_own() -> None:
    key, record = new_key()
    snapshot = snapshot_of([], [record], frozenset({MODEL}))
    with GatewayThread(StaticSource(snapshot), metrics_port=0) as gateway:
        metrics_url = gateway.gateway.metrics_url
        assert metrics_url is not None
        assert metrics_url.startswith("http://127.0.0.1:")
        asked = httpx.post(
            f"{gateway.url}/completions",
            json={"model": MODEL, "prompt": "hi"},
            headers={"authorization": f"Bearer {key}"},
        )

        page = httpx.get(metrics_url)
        on_the_client_listener = httpx.get(f"{gateway.base_url}/metrics")
        api_on_the_metrics_listener = httpx.get(metrics_url.replace("/metrics", "/v1/models"))

    assert asked.status_code == 503
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert f'llmgw_gateway_requests_total{{model="{MODEL}",status="503"}} 1.0' in page.text
    assert on_the_client_listener.status_code == 404
    assert api_on_the_metrics_listener.status_code == 404
