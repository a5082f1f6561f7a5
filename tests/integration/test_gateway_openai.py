"""The official ``openai`` SDK against a real gateway in front of real simulator processes.

Given simulator replicas (one per error style) and a gateway whose routing table and keys
are a fixed snapshot, a client that knows only OpenAI's API gets answers, streams with
usage, and errors it can act on: 400, 401, 404, 429 (quota and capacity), 502 and 503.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.server import StaticSource
from app.gateway.table import Route
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(60)

RUN = uuid.uuid4().hex[:8]
MODEL = f"chat-{RUN}"
FLAT_MODEL = f"flat-{RUN}"
MESSAGE_MODEL = f"message-{RUN}"
IDLE_MODEL = f"idle-{RUN}"
"""Declared, but no replica serves it."""
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
CREATED = {MODEL: 1_764_000_000, FLAT_MODEL: 1_764_000_001, MESSAGE_MODEL: 1_764_000_002}
"""When each model was first declared, as the routing table carries it; IDLE_MODEL's is
unknown."""
TOO_MANY_TOKENS = 10**6
"""More than a simulator's KV cache can ever hold: the engine refuses it with 400."""


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimulatorProcess]]:
    styles = {MODEL: "openai", FLAT_MODEL: "flat", MESSAGE_MODEL: "message"}
    started = {
        model: start_simulator(
            "--instant", "--model", model, "--error-style", style, port=free_port()
        )
        for model, style in styles.items()
    }
    try:
        for sim in started.values():
            sim.wait_healthy()
        yield started
    finally:
        for sim in started.values():
            sim.stop()


class Keys(msgspec.Struct, frozen=True):
    everything: str
    scoped: str
    one_rpm: str


@pytest.fixture(scope="module")
def keys_and_gateway(sims: dict[str, SimulatorProcess]) -> Iterator[tuple[Keys, GatewayThread]]:
    everything, everything_record = new_key()
    scoped, scoped_record = new_key(models=frozenset({MODEL}))
    one_rpm, one_rpm_record = new_key(rpm=1)
    routes = [
        Route(replica_id=f"{model}-1", model=model, url=sim.base_url) for model, sim in sims.items()
    ]
    snapshot = msgspec.structs.replace(
        snapshot_of(
            routes, [everything_record, scoped_record, one_rpm_record], frozenset({IDLE_MODEL})
        ),
        created=CREATED,
    )
    with GatewayThread(StaticSource(snapshot), metrics_port=0) as gateway:
        yield Keys(everything, scoped, one_rpm), gateway


@pytest.fixture
def keys(keys_and_gateway: tuple[Keys, GatewayThread]) -> Keys:
    return keys_and_gateway[0]


@pytest.fixture
def gateway(keys_and_gateway: tuple[Keys, GatewayThread]) -> GatewayThread:
    return keys_and_gateway[1]


@pytest.fixture
def client(gateway: GatewayThread, keys: Keys) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url, api_key=keys.everything, max_retries=0) as client:
        yield client


# -- answers -------------------------------------------------------------------------------


def test_chat_answers_through_the_gateway_with_its_headers(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=5
    )
    completion = raw.parse()
    assert completion.model == MODEL
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert float(raw.headers["x-llmgw-gateway-ms"]) >= 0
    assert raw.headers["x-request-id"].startswith("req_")
    assert raw.headers["content-type"] == "application/json"


def test_text_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4


def test_a_chat_stream_passes_through_with_its_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    usage = chunks[-1].usage
    assert usage is not None
    assert chunks[-1].choices == []
    assert usage.completion_tokens == 6
    assert usage.total_tokens == usage.prompt_tokens + 6


def test_a_completion_stream_without_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_a_raw_stream_carries_the_gateway_headers_and_ends_with_done(
    gateway: GatewayThread, keys: Keys
) -> None:
    with httpx.stream(
        "POST",
        f"{gateway.url}/chat/completions",
        headers={"Authorization": f"Bearer {keys.everything}"},
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True},
    ) as response:
        body = response.read()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert float(response.headers["x-llmgw-gateway-ms"]) >= 0
    assert body.endswith(b"data: [DONE]\n\n")


async def test_the_async_client_chats_and_streams(gateway: GatewayThread, keys: Keys) -> None:
    async with openai.AsyncOpenAI(
        base_url=gateway.url, api_key=keys.everything, max_retries=0
    ) as client:
        whole, text = await asyncio.gather(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3),
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2),
        )
        assert whole.choices[0].message.content
        assert text.choices[0].text
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert float(raw.headers["x-llmgw-gateway-ms"]) >= 0
        chunks = [chunk async for chunk in raw.parse()]
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 4


def test_models_lists_what_the_key_may_use(gateway: GatewayThread, keys: Keys) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key=keys.scoped, max_retries=0) as scoped:
        assert [model.id for model in scoped.models.list()] == [MODEL]
    with openai.OpenAI(base_url=gateway.url, api_key=keys.everything, max_retries=0) as client:
        listed = {model.id for model in client.models.list()}
    assert listed == {MODEL, FLAT_MODEL, MESSAGE_MODEL, IDLE_MODEL}


def test_a_models_card_says_when_it_was_first_declared(gateway: GatewayThread, keys: Keys) -> None:
    # Every model's card said created: 0, the first second of 1970.
    with openai.OpenAI(base_url=gateway.url, api_key=keys.everything, max_retries=0) as client:
        listed = {model.id: model.created for model in client.models.list()}
        retrieved = client.models.retrieve(FLAT_MODEL)

    assert listed == CREATED | {IDLE_MODEL: 0}
    assert retrieved.created == CREATED[FLAT_MODEL]


def test_a_model_is_retrieved_by_name_as_the_key_may_see_it(
    gateway: GatewayThread, keys: Keys
) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key=keys.scoped, max_retries=0) as scoped:
        card = scoped.models.retrieve(MODEL)
        assert (card.id, card.object) == (MODEL, "model")
        for hidden in (FLAT_MODEL, f"undeclared-{RUN}"):
            with pytest.raises(openai.NotFoundError) as refused:
                scoped.models.retrieve(hidden)
            assert refused.value.code == "model_not_found", "the same answer for both"
    with (
        openai.OpenAI(base_url=gateway.url, api_key="llmgw-0-wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.models.retrieve(MODEL)


# -- errors --------------------------------------------------------------------------------


def assert_openai_shape(body: object) -> dict[str, object]:
    """The SDK hands over the ``error`` object; it has exactly OpenAI's fields."""
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}
    assert isinstance(body["message"], str)
    assert body["message"]
    return body


@pytest.mark.parametrize(
    "model", [FLAT_MODEL, MESSAGE_MODEL, MODEL], ids=["flat", "message", "chat"]
)
def test_an_engine_error_is_normalized(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=TOO_MANY_TOKENS)
    assert raised.value.status_code == 400
    body = assert_openai_shape(raised.value.body)
    assert "maximum context length is" in str(body["message"])
    assert raised.value.code == "context_length_exceeded"
    assert raised.value.response.headers["x-llmgw-gateway-ms"]


def test_an_engine_error_on_a_stream_request_is_a_json_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=FLAT_MODEL, messages=MESSAGES, max_tokens=TOO_MANY_TOKENS, stream=True
        )
    assert_openai_shape(raised.value.body)


def test_a_missing_key_is_refused(gateway: GatewayThread) -> None:
    response = httpx.post(
        f"{gateway.url}/chat/completions", json={"model": MODEL, "messages": MESSAGES}
    )
    assert response.status_code == 401
    error = assert_openai_shape(response.json()["error"])
    assert error["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in str(error["message"])
    assert response.headers["x-request-id"]
    assert response.headers["x-llmgw-gateway-ms"]


@pytest.mark.parametrize(
    "presented",
    [
        "sk-not-an-llmgw-key",
        "llmgw-00000000-" + "A" * 40,  # well-formed, unknown prefix
    ],
)
def test_an_unknown_key_is_refused(gateway: GatewayThread, presented: str) -> None:
    with (
        openai.OpenAI(base_url=gateway.url, api_key=presented, max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as raised,
    ):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert raised.value.status_code == 401
    assert assert_openai_shape(raised.value.body)["code"] == "invalid_api_key"


def test_a_known_prefix_with_the_wrong_secret_is_refused(
    gateway: GatewayThread, keys: Keys
) -> None:
    forged = keys.everything[: len("llmgw-12345678-")] + "B" * 43
    with (
        openai.OpenAI(base_url=gateway.url, api_key=forged, max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()


@pytest.mark.parametrize("model", [FLAT_MODEL, f"undeclared-{RUN}"], ids=["flat", "undeclared"])
def test_a_model_outside_the_scope_does_not_exist(
    gateway: GatewayThread, keys: Keys, model: str
) -> None:
    with (
        openai.OpenAI(base_url=gateway.url, api_key=keys.scoped, max_retries=0) as client,
        pytest.raises(openai.NotFoundError) as raised,
    ):
        client.chat.completions.create(model=model, messages=MESSAGES)
    assert raised.value.status_code == 404
    body = assert_openai_shape(raised.value.body)
    assert (body["code"], body["param"]) == ("model_not_found", "model")
    assert model in str(body["message"])


def test_a_declared_model_without_replicas_is_unavailable(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model=IDLE_MODEL, messages=MESSAGES)
    assert raised.value.status_code == 503
    assert assert_openai_shape(raised.value.body)["code"] == "no_serving_replica"


def test_over_the_request_quota_is_429_to_be_retried_when_the_minute_has_room(
    gateway: GatewayThread, keys: Keys
) -> None:
    # Retries off: the SDK would otherwise wait the minute out, as told, and retry (before,
    # the refusal said x-should-retry: false, and this test held the SDK to not retrying).
    with openai.OpenAI(base_url=gateway.url, api_key=keys.one_rpm, max_retries=0) as client:
        first = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=1
        )
        assert first.headers["x-ratelimit-limit-requests"] == "1"
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        refused_before = refusals(gateway)
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    error = raised.value
    assert error.status_code == 429
    assert assert_openai_shape(error.body)["code"] == "rate_limit_exceeded"
    headers = error.response.headers
    assert "x-should-retry" not in headers, "the SDK retries it after retry-after-ms"
    assert 1 <= int(headers["retry-after"]) <= 60
    assert 1000 <= int(headers["retry-after-ms"]) <= 60_000, "no more than the SDKs wait"
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert refusals(gateway) == refused_before + 1


def refusals(gateway: GatewayThread) -> float:
    """429s the gateway answered to the one-rpm key's model, from its own /metrics."""
    return metric(gateway, f'llmgw_gateway_requests_total{{model="{MODEL}",status="429"}}')


def metric(gateway: GatewayThread, series: str) -> float:
    for line in httpx.get(gateway.metrics_url).text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "The request body is empty: send a JSON object with `model`."),
        (b" \r\n", "The request body is empty: send a JSON object with `model`."),
        (b"[1, 2]", "Expected `object`, got `array`"),
        (b'{"messages": []}', "missing required field `model`"),
        (b'{"model": 7}', "Expected `str`, got `int` - at `$.model`"),
        (
            # It said "Input data was truncated", of a body that was whole.
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "The request body is not valid JSON: `\\ud800` at byte 57 is an unpaired UTF-16 "
            "surrogate escape",
        ),
    ],
)
def test_a_malformed_body_is_400(
    gateway: GatewayThread, keys: Keys, body: bytes, says: str
) -> None:
    response = httpx.post(
        f"{gateway.url}/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {keys.everything}"},
    )
    assert response.status_code == 400
    error = assert_openai_shape(response.json()["error"])
    assert says in str(error["message"])
    assert error["type"] == "invalid_request_error"


def test_unknown_paths_and_methods(gateway: GatewayThread) -> None:
    assert httpx.get(f"{gateway.url}/images/generations").status_code == 404
    wrong_method = httpx.get(f"{gateway.url}/chat/completions")
    assert wrong_method.status_code == 405
    # RFC 9110: a 405 names the methods the path takes.
    assert wrong_method.headers["allow"] == "POST"
    assert httpx.delete(f"{gateway.url}/models").headers["allow"] == "GET, HEAD"
    assert httpx.get(f"{gateway.base_url}/healthz").status_code == 200
    ready = httpx.get(f"{gateway.base_url}/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


def test_head_answers_every_get_path_as_get_would_without_a_body(
    gateway: GatewayThread, keys: Keys
) -> None:
    # Every HEAD was 405, so a load balancer's or an uptime checker's HEAD probe read
    # a healthy gateway as failing.
    auth = {"Authorization": f"Bearer {keys.everything}"}
    for url, headers in [
        (f"{gateway.base_url}/healthz", {}),
        (f"{gateway.base_url}/readyz", {}),
        (f"{gateway.url}/models", auth),
        (f"{gateway.url}/models/{MODEL}", auth),
        (f"{gateway.url}/models/undeclared-{RUN}", auth),
        (f"{gateway.url}/models", {}),  # the key is checked as for GET: 401
        (f"{gateway.url}/models/{MODEL}", {}),
    ]:
        got = httpx.get(url, headers=headers)
        head = httpx.head(url, headers=headers)
        assert (head.status_code, head.content) == (got.status_code, b""), url
        # RFC 9110 9.3.2: the fields GET would send, its length included.
        assert head.headers["content-type"] == got.headers["content-type"], url
        assert head.headers["content-length"] == str(len(got.content)), url
    # /metrics too, on its own listener (its page changes with every request, its length too).
    head = httpx.head(gateway.metrics_url)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(head.headers["content-length"]) > 0


def test_a_model_retrieved_without_an_id_is_told_the_id_is_missing(
    gateway: GatewayThread, keys: Keys
) -> None:
    # It was "The model `` does not exist", as if a model named nothing had been looked up.
    auth = {"Authorization": f"Bearer {keys.everything}"}
    answer = httpx.get(f"{gateway.url}/models/", headers=auth)
    assert answer.status_code == 404
    error = assert_openai_shape(answer.json()["error"])
    assert error["message"] == (
        "No model id after /v1/models/: GET /v1/models/{model} retrieves one model, "
        "GET /v1/models lists those your key may use."
    )
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")
    assert httpx.get(f"{gateway.url}/models/").status_code == 401, "the key is checked first"


def test_a_base_url_without_v1_is_told_where_the_api_is(gateway: GatewayThread, keys: Keys) -> None:
    # The most common misconfiguration of a client: its base URL is the gateway's address
    # alone, so the SDK posts to /chat/completions.
    with openai.OpenAI(base_url=gateway.base_url, api_key=keys.everything, max_retries=0) as bare:
        with pytest.raises(openai.NotFoundError) as raised:
            bare.chat.completions.create(model=MODEL, messages=MESSAGES)
        with pytest.raises(openai.NotFoundError) as retrieved:
            bare.models.retrieve(MODEL)
    error = assert_openai_shape(raised.value.body)
    assert error["code"] == "not_found"
    assert error["message"] == (
        "No route for /chat/completions. The API is under /v1: /v1/chat/completions. "
        "An OpenAI client's base URL ends in /v1 (http://host:port/v1)."
    )
    assert "/v1/models/" + MODEL in str(assert_openai_shape(retrieved.value.body)["message"])
    # A path that is no route under /v1 either is not sent there.
    elsewhere = httpx.get(f"{gateway.base_url}/images/generations")
    assert elsewhere.json()["error"]["message"] == "No route for /images/generations."


def test_metrics_count_requests_by_model_and_status(
    gateway: GatewayThread, client: openai.OpenAI
) -> None:
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    text = httpx.get(gateway.metrics_url).text
    assert f'llmgw_gateway_requests_total{{model="{MODEL}",status="200"}}' in text
    assert f'llmgw_gateway_replica_in_flight{{model="{MODEL}",replica="{MODEL}-1"}}' in text
    assert "llmgw_gateway_time_to_first_byte_seconds_bucket" in text
    assert "llmgw_gateway_stale_replicas" in text


# -- retries -------------------------------------------------------------------------------


class HangUpServer:
    """Accepts connections and closes them at once: a replica dying under the gateway."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._listener.close()


def retry_gateway(sim: SimulatorProcess, dead_urls: list[str]) -> tuple[str, GatewayThread]:
    """A gateway whose only model has the dead replicas first and then ``sim``."""
    key, record = new_key()
    routes = [
        Route(replica_id=f"dead-{i}", model=MODEL, url=url) for i, url in enumerate(dead_urls)
    ]
    routes.append(Route(replica_id="live", model=MODEL, url=sim.base_url))
    return key, GatewayThread(StaticSource(snapshot_of(routes, [record])), metrics_port=0)


@pytest.mark.parametrize("dead", ["refuses", "hangs up"])
def test_a_dead_replica_is_retried_on_another(sims: dict[str, SimulatorProcess], dead: str) -> None:
    hang_up = HangUpServer()
    port = free_port() if dead == "refuses" else hang_up.port
    key, gateway_thread = retry_gateway(sims[MODEL], [f"http://127.0.0.1:{port}"])
    try:
        with (
            gateway_thread as gateway,
            openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
        ):
            for _ in range(6):
                completion = client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=1
                )
                assert completion.choices[0].message.content
            assert retries(gateway, "unreachable") > 0
            assert gateway.in_flight() == {"dead-0": 0, "live": 0}
    finally:
        hang_up.close()


def test_an_engine_answering_503_is_retried_on_another(
    sims: dict[str, SimulatorProcess],
) -> None:
    with start_simulator("--never-ready", "--model", MODEL, port=free_port()) as starting:
        key, gateway_thread = retry_gateway(sims[MODEL], [starting.base_url])
        wait_for_status(starting, 503)
        with (
            gateway_thread as gateway,
            openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
        ):
            for _ in range(4):
                client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
            assert retries(gateway, "unavailable") > 0


def test_an_engine_answering_503_with_no_other_replica_passes_it_on() -> None:
    with start_simulator(
        "--never-ready", "--model", MODEL, "--error-style", "flat", port=free_port()
    ) as starting:
        wait_for_status(starting, 503)
        key, record = new_key()
        route = Route(replica_id="starting", model=MODEL, url=starting.base_url)
        with (
            GatewayThread(StaticSource(snapshot_of([route], [record]))) as gateway,
            openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
            pytest.raises(openai.InternalServerError) as raised,
        ):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert raised.value.status_code == 503
    body = assert_openai_shape(raised.value.body)
    assert body["message"] == "The engine is starting."
    assert body["type"] == "server_error"


def wait_for_status(sim: SimulatorProcess, status: int, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while sim.health_status() != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"the simulator did not answer {status} within {within_s} s")
        time.sleep(0.05)


def retries(gateway: GatewayThread, reason: str) -> float:
    return metric(gateway, f'llmgw_gateway_upstream_retries_total{{reason="{reason}"}}')


def test_when_every_replica_is_dead_the_client_gets_502(
    sims: dict[str, SimulatorProcess],
) -> None:
    key, record = new_key()
    routes = [
        Route(replica_id=f"dead-{i}", model=MODEL, url=f"http://127.0.0.1:{free_port()}")
        for i in range(2)
    ]
    with (
        GatewayThread(StaticSource(snapshot_of(routes, [record]))) as gateway,
        openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
        pytest.raises(openai.InternalServerError) as raised,
    ):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert raised.value.status_code == 502
    assert assert_openai_shape(raised.value.body)["code"] == "upstream_unreachable"


def test_an_engine_dying_mid_stream_ends_the_stream_with_an_error() -> None:
    key, record = new_key()
    port = free_port()
    route = Route(replica_id="doomed", model=MODEL, url=f"http://127.0.0.1:{port}")
    slow = ("--decode-base-ms", "50", "--decode-per-seq-ms", "0")
    with (
        GatewayThread(StaticSource(snapshot_of([route], [record]))) as gateway,
        start_simulator("--model", MODEL, *slow, "--exit-after", "3", port=port) as doomed,
        openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
    ):
        doomed.wait_healthy()
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=1000, stream=True
        )
        received: list[object] = []
        with pytest.raises(openai.APIError) as raised:
            received.extend(stream)
    assert received
    assert "stopped answering mid-stream" in raised.value.message
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["code"] == "upstream_disconnected"
