"""The rest of OpenAI's surface through a real gateway in front of real simulator processes:
embeddings and responses with the official ``openai`` SDK, rerank, score, tokenize and
transcriptions and translations with httpx, under the same keys, scopes and limits as chat.

Given one simulator whose model's spec names every API and one whose spec names only chat
and completions (the default), a client gets each API's answer, a stream of Responses
events as the engine writes them, 404 for an API its model does not serve or a model its
key may not use, 400 for a malformed request, 413 for an upload over the limit, and an
upload that reaches the engine while the client is still sending it.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator

import httpx
import msgspec
import openai
import pytest

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.domain.model_spec import API_NAMES
from app.gateway.server import StaticSource
from app.gateway.table import GatewaySnapshot, Route
from tests.support.gateway import GatewayThread, new_key, snapshot_of
from tests.support.ports import free_port
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.timeout(120)

RUN = uuid.uuid4().hex[:8]
EVERYTHING = f"all-apis-{RUN}"
CHAT_ONLY = f"chat-only-{RUN}"
SMALL_LIMIT = 256 * 1024
MIB = 1024 * 1024
JSON_CONTENT = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimulatorProcess]]:
    started = {
        model: start_simulator("--instant", "--model", model, port=free_port())
        for model in (EVERYTHING, CHAT_ONLY)
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
    chat_only: str
    one_rpm: str


def snapshot(sims: dict[str, SimulatorProcess], keys: list[object]) -> GatewaySnapshot:
    routes = [
        Route(replica_id=f"{model}-1", model=model, url=sim.base_url) for model, sim in sims.items()
    ]
    base = snapshot_of(routes, keys)  # type: ignore[arg-type]
    return msgspec.structs.replace(base, apis={EVERYTHING: frozenset(API_NAMES)})


@pytest.fixture(scope="module")
def keys_and_gateways(
    sims: dict[str, SimulatorProcess],
) -> Iterator[tuple[Keys, GatewayThread, GatewayThread]]:
    everything, everything_record = new_key()
    chat_only, chat_only_record = new_key(models=frozenset({CHAT_ONLY}))
    one_rpm, one_rpm_record = new_key(rpm=1)
    table = snapshot(sims, [everything_record, chat_only_record, one_rpm_record])
    with (
        GatewayThread(StaticSource(table)) as gateway,
        GatewayThread(StaticSource(table), max_upload_bytes=SMALL_LIMIT) as small,
    ):
        yield Keys(everything, chat_only, one_rpm), gateway, small


@pytest.fixture
def keys(keys_and_gateways: tuple[Keys, GatewayThread, GatewayThread]) -> Keys:
    return keys_and_gateways[0]


@pytest.fixture
def gateway(keys_and_gateways: tuple[Keys, GatewayThread, GatewayThread]) -> GatewayThread:
    return keys_and_gateways[1]


@pytest.fixture
def small_gateway(keys_and_gateways: tuple[Keys, GatewayThread, GatewayThread]) -> GatewayThread:
    """The same table, with uploads limited to ``SMALL_LIMIT`` bytes."""
    return keys_and_gateways[2]


@pytest.fixture
def client(gateway: GatewayThread, keys: Keys) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url, api_key=keys.everything, max_retries=0) as client:
        yield client


@pytest.fixture
def http(gateway: GatewayThread, keys: Keys) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {keys.everything}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as http:
        yield http


# -- embeddings and responses, with the openai SDK -----------------------------------------


def test_embeddings_are_answered_and_the_same_text_gets_the_same_vector(
    client: openai.OpenAI,
) -> None:
    # The SDK asks for base64 unless told otherwise; both encodings must carry the vector.
    encoded = client.embeddings.create(model=EVERYTHING, input=["hello world", "other"])
    floats = client.embeddings.create(
        model=EVERYTHING, input="hello world", encoding_format="float", dimensions=16
    )

    assert [item.index for item in encoded.data] == [0, 1]
    assert encoded.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)
    assert encoded.data[0].embedding != encoded.data[1].embedding
    assert sum(v * v for v in floats.data[0].embedding) == pytest.approx(1.0)
    assert encoded.usage.total_tokens == 3


def test_a_response_is_answered_whole(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=EVERYTHING, input="Say something short.", max_output_tokens=5
    )
    response = raw.parse()

    assert response.status == "completed"
    assert response.output_text == "the quick brown fox jumps"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 5)
    assert raw.headers["x-request-id"].startswith("req_")


def test_a_response_streams_the_engines_events_as_they_come(client: openai.OpenAI) -> None:
    with client.responses.create(
        model=EVERYTHING,
        input=[{"role": "user", "content": "Say something short."}],
        max_output_tokens=4,
        stream=True,
    ) as stream:
        events = list(stream)

    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4:8] == ["response.output_text.delta"] * 4
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1]
    assert final.type == "response.completed"
    assert deltas == final.response.output_text == "the quick brown fox"


# -- rerank, score, tokenize -------------------------------------------------------------


def test_rerank_orders_the_documents_by_relevance(http: httpx.Client) -> None:
    answer = http.post(
        "/rerank",
        json={"model": EVERYTHING, "query": "fox", "documents": ["dog", "fox", "cat"], "top_n": 2},
    )

    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert len(results) == 2
    assert results[0] == {"index": 1, "document": {"text": "fox"}, "relevance_score": 1.0}
    assert answer.headers["x-request-id"].startswith("req_")


def test_score_pairs_one_text_with_each_of_the_others(http: httpx.Client) -> None:
    answer = http.post("/score", json={"model": EVERYTHING, "text_1": "a", "text_2": ["a", "b"]})

    assert answer.status_code == 200, answer.text
    scores = [item["score"] for item in answer.json()["data"]]
    assert scores[0] == pytest.approx(1.0)
    assert scores[1] < 1.0


def test_tokenize_and_detokenize_round_trip(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"model": EVERYTHING, "prompt": "to be or not to be"})
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    assert tokens.json()["count"] == 6
    assert ids[0] == ids[4]

    text = http.post("/detokenize", json={"model": EVERYTHING, "tokens": ids})
    assert text.status_code == 200, text.text
    assert text.json()["prompt"] == "to be or not to be"


# -- transcriptions ------------------------------------------------------------------------


def test_a_transcription_with_the_sdk(client: openai.OpenAI) -> None:
    audio = b"RIFF" + bytes(range(256)) * 100
    transcription = client.audio.transcriptions.create(
        model=EVERYTHING, file=("speech.wav", audio, "audio/wav")
    )
    digest = hashlib.sha256(audio).hexdigest()[:16]
    assert transcription.text == f"{len(audio)} bytes, sha256 {digest}"


def test_a_translation_goes_to_the_engines_translations_path(http: httpx.Client) -> None:
    answer = http.post(
        "/audio/translations",
        data={"model": EVERYTHING, "response_format": "verbose_json"},
        files={"file": ("speech.wav", b"RIFF0000", "audio/wav")},
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["task"] == "translate", "sent to the engine's transcriptions path"


def uploaded(sim: SimulatorProcess) -> tuple[int, int]:
    """File bytes the simulator has received so far, and uploads it is reading now."""
    stats = httpx.get(f"{sim.base_url}/sim/uploads").json()
    return stats["bytes_received"], stats["in_progress"]


BOUNDARY = "surface-test-boundary"


def form_head(model: str) -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()


FORM_END = f"\r\n--{BOUNDARY}--\r\n".encode()
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def test_a_large_upload_reaches_the_engine_while_the_client_is_still_sending(
    http: httpx.Client, sims: dict[str, SimulatorProcess]
) -> None:
    sim = sims[EVERYTHING]
    before, _ = uploaded(sim)
    piece = bytes(range(256)) * 4096  # 1 MiB
    pieces = 48
    digest = hashlib.sha256()
    waited_for_engine = threading.Event()

    def body() -> Iterator[bytes]:
        yield form_head(EVERYTHING)
        for number in range(pieces):
            if number == 8:
                # Far more than any buffer on the way holds is still to come: a gateway
                # that read the upload whole would have sent the engine nothing yet.
                wait_until_blocking(
                    lambda: uploaded(sim)[0] - before >= 2 * MIB,
                    within_s=20,
                    what="the engine receiving bytes while the client was still sending",
                )
                waited_for_engine.set()
            digest.update(piece)
            yield piece
        yield FORM_END

    answer = http.post("/audio/transcriptions", content=body(), headers=MULTIPART)

    assert answer.status_code == 200, answer.text
    assert waited_for_engine.is_set()
    size = pieces * len(piece)
    assert answer.json()["text"] == f"{size} bytes, sha256 {digest.hexdigest()[:16]}"
    assert uploaded(sim)[0] - before == size


def test_an_upload_over_the_limit_by_its_length_is_413_before_the_engine_sees_it(
    small_gateway: GatewayThread, keys: Keys, sims: dict[str, SimulatorProcess]
) -> None:
    before = uploaded(sims[EVERYTHING])
    content = form_head(EVERYTHING) + b"a" * SMALL_LIMIT + FORM_END

    answer = httpx.post(
        f"{small_gateway.url}/audio/transcriptions",
        content=content,
        headers={**MULTIPART, "authorization": f"Bearer {keys.everything}"},
    )

    assert answer.status_code == 413
    assert answer.json()["error"]["message"] == f"The request body exceeds {SMALL_LIMIT} bytes."
    assert uploaded(sims[EVERYTHING]) == before


def test_an_upload_that_passes_the_limit_while_streaming_is_413_and_the_engine_lets_go(
    small_gateway: GatewayThread, keys: Keys, sims: dict[str, SimulatorProcess]
) -> None:
    def body() -> Iterator[bytes]:  # no length: sent chunked
        yield form_head(EVERYTHING)
        for _ in range(8):
            yield b"a" * (SMALL_LIMIT // 4)
        yield FORM_END

    answer = httpx.post(
        f"{small_gateway.url}/audio/transcriptions",
        content=body(),
        headers={**MULTIPART, "authorization": f"Bearer {keys.everything}"},
    )

    assert answer.status_code == 413
    assert answer.json()["error"]["type"] == "invalid_request_error"
    wait_until_blocking(lambda: uploaded(sims[EVERYTHING])[1] == 0, within_s=10)
    wait_until_blocking(lambda: not any(small_gateway.in_flight().values()), within_s=10)


def test_a_client_that_leaves_mid_upload_cancels_it_in_the_engine(
    gateway: GatewayThread, keys: Keys, sims: dict[str, SimulatorProcess]
) -> None:
    sim = sims[EVERYTHING]
    before, _ = uploaded(sim)

    class Left(Exception):
        pass

    def body() -> Iterator[bytes]:
        yield form_head(EVERYTHING)
        for _ in range(4):
            yield b"a" * MIB
        wait_until_blocking(
            lambda: uploaded(sim)[0] > before and uploaded(sim)[1] == 1, within_s=20
        )
        raise Left

    with pytest.raises(Left):
        httpx.post(
            f"{gateway.url}/audio/transcriptions",
            content=body(),
            headers={**MULTIPART, "authorization": f"Bearer {keys.everything}"},
        )

    wait_until_blocking(
        lambda: uploaded(sim)[1] == 0, within_s=10, what="the engine letting go of the upload"
    )
    wait_until_blocking(lambda: not any(gateway.in_flight().values()), within_s=10)


def test_an_upload_must_name_its_model_before_its_file(http: httpx.Client) -> None:
    content = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        f'abc\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        f"{EVERYTHING}\r\n--{BOUNDARY}--\r\n"
    ).encode()

    answer = http.post("/audio/transcriptions", content=content, headers=MULTIPART)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "model"
    assert "`model` field before its file" in error["message"]


@pytest.mark.parametrize(
    "part",
    [
        "",
        # A file without a filename is a plain field to an engine (vLLM's form parser).
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\nabc\r\n',
    ],
)
def test_an_upload_without_a_file_is_a_400_from_the_gateway(http: httpx.Client, part: str) -> None:
    content = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        f"{EVERYTHING}\r\n{part}--{BOUNDARY}--\r\n"
    ).encode()

    answer = http.post("/audio/transcriptions", content=content, headers=MULTIPART)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "file"
    # In the gateway's words: the form never went to an engine.
    assert error["message"] == "The form has no file: send it as the `file` part, with a filename."


def test_an_upload_that_is_not_a_form_is_a_400(http: httpx.Client) -> None:
    answer = http.post("/audio/transcriptions", json={"model": EVERYTHING})
    assert answer.status_code == 400
    assert "multipart/form-data" in answer.json()["error"]["message"]


# -- scopes, APIs a model does not serve, limits, malformed bodies ----------------------------


def test_an_api_the_model_does_not_serve_is_404(gateway: GatewayThread, keys: Keys) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key=keys.everything, max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as raised:
            client.embeddings.create(model=CHAT_ONLY, input="x")
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=CHAT_ONLY, input="x")
        # What it does serve still answers.
        client.chat.completions.create(
            model=CHAT_ONLY, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )

    assert raised.value.code == "model_not_found"
    assert "does not name the `embeddings` API" in raised.value.message


def test_a_key_without_the_models_scope_is_refused_on_every_api(
    gateway: GatewayThread, keys: Keys
) -> None:
    headers = {"authorization": f"Bearer {keys.chat_only}"}
    with openai.OpenAI(base_url=gateway.url, api_key=keys.chat_only, max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as raised:
            client.embeddings.create(model=EVERYTHING, input="x")
        with pytest.raises(openai.NotFoundError):
            client.audio.transcriptions.create(model=EVERYTHING, file=("a.wav", b"abc"))
    score = httpx.post(
        f"{gateway.url}/score",
        json={"model": EVERYTHING, "text_1": "a", "text_2": "b"},
        headers=headers,
    )

    assert "does not exist or you do not have access to it" in raised.value.message
    assert score.status_code == 404
    assert score.json()["error"]["code"] == "model_not_found"


def test_models_say_which_apis_each_serves(http: httpx.Client) -> None:
    cards = {card["id"]: card for card in http.get("/models").json()["data"]}
    assert cards[EVERYTHING]["apis"] == sorted(API_NAMES)
    assert cards[CHAT_ONLY]["apis"] == ["chat", "completions"]


def test_the_keys_rate_limit_counts_every_api(gateway: GatewayThread, keys: Keys) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key=keys.one_rpm, max_retries=0) as client:
        client.embeddings.create(model=EVERYTHING, input="x")
        with pytest.raises(openai.RateLimitError) as raised:
            client.responses.create(model=EVERYTHING, input="x")
    assert raised.value.code == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/embeddings", b'{"input": "x"}', "missing required field `model`"),
        ("/rerank", b'{"model": 7}', "Expected `str`, got `int`"),
        ("/responses", b"{not json", "not valid JSON"),
    ],
)
def test_a_malformed_request_is_a_400_saying_what_is_wrong(
    http: httpx.Client, path: str, body: bytes, says: str
) -> None:
    answer = http.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert says in answer.json()["error"]["message"]


UTF8_BOM = b"\xef\xbb\xbf"
"""What some Windows clients write before their JSON (RFC 8259 section 8.1 lets a reader
ignore it)."""


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/completions", {"prompt": "hi"}),
        ("/embeddings", {"input": "hi"}),
        ("/responses", {"input": "hi"}),
        ("/tokenize", {"prompt": "hi"}),
    ],
)
def test_a_body_led_by_a_byte_order_mark_is_served_and_the_engine_gets_plain_json(
    http: httpx.Client, path: str, fields: dict[str, object]
) -> None:
    body = UTF8_BOM + msgspec.json.encode({"model": EVERYTHING, **fields})

    answer = http.post(path, content=body, headers=JSON_CONTENT)

    # The simulator, like any strict JSON reader, refuses a mark: 200 means it got none.
    assert answer.status_code == 200, answer.text


def test_a_byte_order_mark_sent_apart_from_the_json_is_skipped_too(http: httpx.Client) -> None:
    def pieces() -> Iterator[bytes]:  # chunked: each piece may reach the gateway on its own
        yield UTF8_BOM[:1]
        yield UTF8_BOM[1:]
        yield msgspec.json.encode({"model": EVERYTHING, "prompt": "hi"})

    answer = http.post("/completions", content=pieces(), headers=JSON_CONTENT)

    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    "body",
    [
        UTF8_BOM + UTF8_BOM + b'{"model": "%s", "prompt": "hi"}' % EVERYTHING.encode(),
        b' %s{"model": "%s", "prompt": "hi"}' % (UTF8_BOM, EVERYTHING.encode()),
    ],
    ids=["twice", "after-whitespace"],
)
def test_a_byte_order_mark_is_skipped_only_once_and_only_first(
    http: httpx.Client, body: bytes
) -> None:
    answer = http.post("/completions", content=body, headers=JSON_CONTENT)

    assert answer.status_code == 400
    assert "not valid JSON" in answer.json()["error"]["message"]


def test_an_engines_refusal_reaches_the_client_in_openais_shape(http: httpx.Client) -> None:
    answer = http.post("/detokenize", json={"model": EVERYTHING, "tokens": [10**9]})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == f"Unknown token id {10**9}."


def test_the_new_paths_take_only_post(http: httpx.Client) -> None:
    for path in (
        "/embeddings",
        "/responses",
        "/audio/transcriptions",
        "/audio/translations",
        "/tokenize",
    ):
        answer = http.get(path)
        assert answer.status_code == 405
        assert answer.json()["error"]["code"] == "method_not_allowed"


def test_an_upload_goes_to_another_replica_when_one_cannot_be_reached(
    sims: dict[str, SimulatorProcess], keys: Keys
) -> None:
    """Nothing of an upload has gone when connecting fails, so it may be sent elsewhere;
    with no other replica the client learns why."""
    dead = Route(
        replica_id=f"{EVERYTHING}-dead", model=EVERYTHING, url=f"http://127.0.0.1:{free_port()}"
    )
    alive = Route(replica_id=f"{EVERYTHING}-1", model=EVERYTHING, url=sims[EVERYTHING].base_url)
    key, record = new_key()
    both = msgspec.structs.replace(
        snapshot_of([dead, alive], [record]), apis={EVERYTHING: frozenset(API_NAMES)}
    )
    only_dead = msgspec.structs.replace(both, routes={EVERYTHING: (dead,)})
    audio = b"a" * 5000

    with (
        GatewayThread(StaticSource(both)) as gateway,
        openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
    ):
        texts = {
            client.audio.transcriptions.create(model=EVERYTHING, file=("a.wav", audio)).text
            for _ in range(8)
        }
        gateway.publish(only_dead)
        with pytest.raises(openai.InternalServerError) as raised:
            client.audio.transcriptions.create(model=EVERYTHING, file=("a.wav", audio))

    assert texts == {f"5000 bytes, sha256 {hashlib.sha256(audio).hexdigest()[:16]}"}
    assert raised.value.status_code == 502
    assert raised.value.code == "upstream_unreachable"


def metric(sim: SimulatorProcess, name: str) -> float:
    """The sum of a simulator's samples of ``name``."""
    total = 0.0
    for line in httpx.get(f"{sim.base_url}/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_client_leaving_a_responses_stream_aborts_it_in_the_engine() -> None:
    slow_model = f"slow-{RUN}"
    with start_simulator(
        "--model", slow_model, "--decode-base-ms", "40", "--decode-per-seq-ms", "0",
        port=free_port(),
    ) as sim:  # fmt: skip
        sim.wait_healthy()
        key, record = new_key()
        route = Route(replica_id=f"{slow_model}-1", model=slow_model, url=sim.base_url)
        table = msgspec.structs.replace(
            snapshot_of([route], [record]), apis={slow_model: frozenset({"responses"})}
        )
        aborted = metric(sim, "llmgw_sim:requests_aborted_total")
        with (
            GatewayThread(StaticSource(table)) as gateway,
            openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client,
        ):
            stream = client.responses.create(
                model=slow_model, input="hi", max_output_tokens=500, stream=True
            )
            first = next(iter(stream))
            stream.close()  # about 20 s of tokens still to come

            wait_until_blocking(
                lambda: metric(sim, "llmgw_sim:requests_aborted_total") == aborted + 1,
                what="the engine aborting the response",
            )
            wait_until_blocking(lambda: not any(gateway.in_flight().values()))
    assert first.type == "response.created"
