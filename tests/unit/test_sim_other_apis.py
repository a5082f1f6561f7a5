"""The simulator's answers beyond completions: deterministic vectors, rerank and score from
them, a vocabulary that gives back what it was given, Responses events in order, and an
upload read piece by piece."""

from __future__ import annotations

import base64
import hashlib
import struct

import msgspec
import pytest

from agent.simulator import pooling
from agent.simulator.errors import ApiError
from agent.simulator.generation import parse_responses
from agent.simulator.responses_api import ResponsesRenderer
from agent.simulator.transcriptions import Transcription, TranscriptionReader, UploadStats
from agent.simulator.wire import (
    DetokenizeRequest,
    EmbeddingsRequest,
    RerankRequest,
    TokenizeRequest,
)

MODEL = "sim"


def test_the_same_text_gets_the_same_unit_vector_and_another_text_another() -> None:
    a, again, other = pooling.embedding("a fox"), pooling.embedding("a fox"), pooling.embedding("b")
    assert a == again != other
    assert sum(v * v for v in a) == pytest.approx(1.0)
    assert len(pooling.embedding("x", 100)) == 100


def test_base64_embeddings_pack_the_same_vector_as_floats() -> None:
    request = EmbeddingsRequest(model=MODEL, input=["a", "b"], encoding_format="base64")
    [first, _] = msgspec.json.decode(pooling.embeddings_body(request, MODEL))["data"]
    packed = base64.b64decode(first["embedding"])
    unpacked = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert unpacked == pytest.approx(pooling.embedding("a"), abs=1e-6)


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (EmbeddingsRequest(model=MODEL, input=[]), "must not be empty"),
        (EmbeddingsRequest(model=MODEL, input="x", dimensions=0), "`dimensions` must be"),
        (EmbeddingsRequest(model=MODEL, input=["x"] * 3000), "more than 2048"),
    ],
)
def test_bad_embedding_requests_are_400s(request_: EmbeddingsRequest, says: str) -> None:
    with pytest.raises(ApiError, match=says) as raised:
        pooling.embeddings_body(request_, MODEL)
    assert raised.value.status == 400


def test_rerank_puts_the_query_itself_first() -> None:
    request = RerankRequest(model=MODEL, query="fox", documents=["dog", "cat", "fox"])
    results = msgspec.json.decode(pooling.rerank_body(request, MODEL))["results"]
    assert results[0]["index"] == 2
    assert results[0]["relevance_score"] == pytest.approx(1.0)
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)


def test_detokenize_gives_back_what_tokenize_was_given() -> None:
    vocabulary = pooling.Vocabulary()
    tokens = msgspec.json.decode(
        vocabulary.tokenize_body(TokenizeRequest(model=MODEL, prompt="a rose is a rose"))
    )["tokens"]
    text = vocabulary.detokenize_body(DetokenizeRequest(model=MODEL, tokens=tokens))
    assert msgspec.json.decode(text) == {"prompt": "a rose is a rose"}
    with pytest.raises(ApiError, match="Unknown token id 99"):
        vocabulary.detokenize_body(DetokenizeRequest(model=MODEL, tokens=[99]))


def test_a_responses_stream_is_numbered_events_ending_with_the_completed_response() -> None:
    generation = parse_responses(
        b'{"model": "sim", "input": "hi there", "max_output_tokens": 3, "stream": true}', MODEL
    )
    renderer = ResponsesRenderer(generation, MODEL)
    stream = renderer.opening() + renderer.tokens(0, 3) + renderer.closing(3)

    events = [block.split(b"\n") for block in stream.strip().split(b"\n\n")]
    kinds = [lines[0].removeprefix(b"event: ").decode() for lines in events]
    payloads = [msgspec.json.decode(lines[1].removeprefix(b"data: ")) for lines in events]
    assert kinds == [p["type"] for p in payloads]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert kinds.count("response.output_text.delta") == 3
    completed = payloads[-1]["response"]
    assert completed["status"] == "completed"
    assert completed["usage"]["total_tokens"] == 2 + 3
    assert completed["output"][0]["content"][0]["text"] == "the quick brown"
    about_the_part = [p for p in payloads if "content_index" in p]
    assert [p["type"] for p in about_the_part] == [
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
    ]
    assert {(p["item_id"], p["output_index"], p["content_index"]) for p in about_the_part} == {
        (completed["output"][0]["id"], 0, 0)
    }


def test_an_upload_is_counted_as_it_is_read_and_never_kept() -> None:
    boundary = "b0undary"
    audio = bytes(range(256)) * 1000
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{MODEL}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        ).encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    stats = UploadStats()
    reader = TranscriptionReader(f"multipart/form-data; boundary={boundary}", stats)

    for start in range(0, len(body), 4096):
        reader.feed(body[start : start + 4096])
        assert stats.bytes_received <= min(start + 4096, len(audio))

    result = reader.result(MODEL)
    assert stats.bytes_received == len(audio)
    assert result.text() == f"{len(audio)} bytes, sha256 {hashlib.sha256(audio).hexdigest()[:16]}"


def test_an_upload_for_another_model_or_without_a_file_is_refused() -> None:
    boundary = "b"
    field = f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nother\r\n'
    reader = TranscriptionReader(f"multipart/form-data; boundary={boundary}", UploadStats())
    reader.feed((field + f"--{boundary}--\r\n").encode())
    with pytest.raises(ApiError) as raised:
        reader.result(MODEL)
    assert raised.value.status == 404


def test_a_translation_names_its_task_in_a_verbose_answer() -> None:
    content_type, body = Transcription(MODEL, 3, "ab" * 32, "verbose_json", task="translate").body()

    assert content_type == b"application/json"
    assert msgspec.json.decode(body)["task"] == "translate"
    plain = Transcription(MODEL, 3, "ab" * 32, "verbose_json").body()[1]
    assert msgspec.json.decode(plain)["task"] == "transcribe"
