"""Hostile clients at a real gateway (uvicorn on a loopback socket, its own loop in a thread).

What an attacker sends (JSON nested a thousand deep, one wrong key after another, a scrape
of ``/metrics``) gets an OpenAI-shaped answer that costs only that client, and the gateway
keeps serving everyone else.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from app.gateway.request_body import MAX_BODY_BYTES
from app.gateway.server import StaticSource
from app.listeners.throttle import FailureLimits
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


# -- wrong keys, one after another ---------------------------------------------------------

BURST = 5


def from_address(address: str, gateway: GatewayThread, key: str | None) -> httpx.Client:
    """A client whose connections come from ``address`` (any of 127.0.0.0/8 is this host)."""
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=gateway.url, headers=headers, transport=transport)


def test_an_address_sending_wrong_keys_gets_429_and_nobody_else_is_slowed() -> None:
    key, record = new_key()
    wrong, _ = new_key()
    snapshot = snapshot_of([], [record], frozenset({MODEL}))
    limits = FailureLimits(burst=BURST, per_minute=1)
    with GatewayThread(StaticSource(snapshot), auth_failures=limits) as gateway:
        with from_address("127.0.0.1", gateway, wrong) as attacker:
            flood = [attacker.get("/models") for _ in range(1000)]
        with from_address("127.0.0.1", gateway, key) as same_address:
            valid_from_the_attackers_address = same_address.get("/models")
        with from_address("127.0.0.1", gateway, None) as keyless:
            without_a_key = keyless.get("/models")
        with from_address("127.0.0.2", gateway, wrong) as neighbour:
            wrong_from_elsewhere = neighbour.get("/models")
        with from_address("127.0.0.2", gateway, key) as other:
            valid_from_elsewhere = other.get("/models")

    assert [a.status_code for a in flood] == [401] * BURST + [429] * (1000 - BURST)
    throttled = flood[-1]
    # One failure a minute comes back: less what has already refilled while flooding.
    retry_after = int(throttled.headers["retry-after"])
    assert 1 <= retry_after <= 60
    error = throttled.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "too_many_failed_authentications"
    assert f"retry after {retry_after} s" in error["message"]
    # The same wrong key fails again whenever it is sent: the openai SDK, which retries
    # every 429 twice by default, obeys this before anything else (`_should_retry`).
    assert throttled.headers["x-should-retry"] == "false"
    # A valid key is served whatever its address has failed; a request without a key is
    # no guess and is told so.
    assert valid_from_the_attackers_address.status_code == 200
    assert without_a_key.status_code == 401
    assert "Missing API key" in without_a_key.json()["error"]["message"]
    # Another address has a budget of its own.
    assert wrong_from_elsewhere.status_code == 401
    assert valid_from_elsewhere.status_code == 200


# -- Authorization more than once ----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/models", None),
        ("POST", "/chat/completions", f'{{"model": "{MODEL}", "messages": []}}'),
        ("POST", "/audio/transcriptions", None),
    ],
)
def test_a_request_with_two_authorization_headers_is_a_400_whichever_one_is_valid(
    key_and_gateway: tuple[str, GatewayThread], method: str, path: str, body: str | None
) -> None:
    """Authorization is a singleton field: a proxy in front may have checked the other
    one. The gateway serves neither, on every route that takes a key."""
    key, gateway = key_and_gateway
    wrong, _ = new_key()
    with httpx.Client(base_url=gateway.url) as client:
        answers = [
            client.request(
                method,
                path,
                content=body,
                headers=[
                    ("authorization", f"Bearer {first}"),
                    ("authorization", f"Bearer {second}"),
                ],
            )
            for first, second in ((key, wrong), (wrong, key))
        ]
        served = client.get("/models", headers={"authorization": f"Bearer {key}"})

    for answer in answers:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "Authorization header appears more than once" in error["message"]
        assert answer.headers["x-request-id"].startswith("req_")
    assert served.status_code == 200


# -- a chunked body that grows past the limit ------------------------------------------------

PAST_THE_LIMIT = 64 * 1024 * 1024
"""How much more than the limit the client would send: far more than the sockets' buffers."""


def test_a_chunked_body_past_the_limit_is_413_and_closed_while_the_client_still_sends(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    """A body sent chunked announces no length: the gateway reads it until it passes
    32 MiB, then answers 413 and closes the connection, rather than read the rest."""
    key, gateway = key_and_gateway
    address = httpx.URL(gateway.base_url)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address.host}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b" " * 65536
    frame = b"%x\r\n%s\r\n" % (len(piece), piece)
    received = b""
    sent = 0
    with socket.create_connection((address.host, address.port), timeout=10) as connection:
        connection.setblocking(False)
        unsent = head
        while True:
            assert sent < MAX_BODY_BYTES + PAST_THE_LIMIT, (
                f"still read {sent - MAX_BODY_BYTES} bytes past the limit, after {received[:80]!r}"
            )
            readable, writable, _ = select.select([connection], [connection], [], 10)
            assert readable or writable, "the gateway neither answers nor reads"
            if readable:
                data = connection.recv(65536)
                if not data:
                    break  # closed by the gateway, while the client had more to send
                received += data
                continue
            unsent = unsent or frame
            count = connection.send(unsent)
            unsent = unsent[count:]
            sent += count

    answer_head, _, body = received.partition(b"\r\n\r\n")
    assert answer_head.startswith(b"HTTP/1.1 413"), received[:200]
    assert b"\r\nconnection: close" in answer_head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"The request body exceeds {MAX_BODY_BYTES} bytes."
    assert sent > MAX_BODY_BYTES


# -- an idle kept-alive connection outlives the clients' own pools -------------------------


def test_a_kept_alive_connection_idle_longer_than_an_sdk_pool_keeps_one_still_serves(
    key_and_gateway: tuple[str, GatewayThread],
) -> None:
    """The ``openai`` SDK (httpx) drops an idle pooled connection after 5 s. Were the
    gateway to close it at the same moment, a request sent just then would fail unsent;
    the gateway keeps it longer, so the client is the one to let go."""
    _, gateway = key_and_gateway
    address = httpx.URL(gateway.base_url)
    request = f"GET /readyz HTTP/1.1\r\nHost: {address.host}\r\n\r\n".encode()
    with socket.create_connection((address.host, address.port), timeout=5) as connection:
        connection.sendall(request)
        assert read_answer(connection).startswith(b"HTTP/1.1 200")

        idle_until = time.monotonic() + SDK_POOL_IDLE_S + 1.0
        while time.monotonic() < idle_until:
            readable, _, _ = select.select([connection], [], [], idle_until - time.monotonic())
            assert not readable, "the gateway closed an idle kept-alive connection"

        connection.sendall(request)
        assert read_answer(connection).startswith(b"HTTP/1.1 200")


SDK_POOL_IDLE_S = 5.0


def read_answer(connection: socket.socket) -> bytes:
    """One small answer: its head and the body its Content-Length announces."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(4096)
        assert chunk, f"closed after {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = connection.recv(4096)
        assert chunk, f"closed after {received!r}"
        body += chunk
    return head
