"""Answers that need no generation: embeddings, rerank, score, tokenize and detokenize, in
vLLM's shapes.

Vectors are deterministic: a text's embedding is built from the SHA-256 of its bytes, so
the same input always gets the same vector and different inputs (almost surely) different
ones; it is scaled to length 1, so the score of two texts is their vectors' dot product (1
for the same text). A token is a word of the text (``agent.simulator.tokens``); its id is
its place in the vocabulary this process has met so far, so ``detokenize`` gives back the
words ``tokenize`` was given.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
import uuid
from typing import Any, TypeVar

import msgspec

from agent.simulator.errors import ApiError, invalid_request, model_not_found
from agent.simulator.tokens import tokenize
from agent.simulator.wire import (
    DetokenizeRequest,
    EmbeddingsRequest,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
)

DEFAULT_DIMENSIONS = 16
MAX_DIMENSIONS = 4096
MAX_INPUTS = 2048
"""Texts in one request (OpenAI's own limit for embeddings)."""
MAX_VOCABULARY = 1 << 20
"""Words the tokenizer gives ids to; a word met after that is ``UNKNOWN_ID``."""
UNKNOWN_ID = 0
MAX_MODEL_LEN = 8192

_Request = TypeVar(
    "_Request",
    EmbeddingsRequest,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
    DetokenizeRequest,
)
_encode = msgspec.json.Encoder().encode


def decode(body: bytes, kind: type[_Request], served_model: str) -> _Request:
    try:
        request = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise invalid_request(f"Invalid request body: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from exc
    if request.model != served_model:
        raise model_not_found(request.model)
    return request


def embedding(text: str, dimensions: int = DEFAULT_DIMENSIONS) -> list[float]:
    """The unit vector of ``text``: the same text, the same vector."""
    values: list[float] = []
    counter = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(b"%d:" % counter + text.encode()).digest()
        values.extend(byte / 127.5 - 1.0 for byte in digest)
        counter += 1
    vector = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def similarity(a: str, b: str) -> float:
    return sum(x * y for x, y in zip(embedding(a), embedding(b), strict=True))


def embeddings_body(request: EmbeddingsRequest, model: str) -> bytes:
    texts = _texts(request.input)
    dimensions = DEFAULT_DIMENSIONS if request.dimensions is None else request.dimensions
    if not 1 <= dimensions <= MAX_DIMENSIONS:
        raise invalid_request(
            f"`dimensions` must be between 1 and {MAX_DIMENSIONS}.", param="dimensions"
        )
    if request.encoding_format not in ("float", "base64"):
        raise invalid_request("`encoding_format` must be float or base64.", param="encoding_format")
    data: list[dict[str, Any]] = []
    for index, text in enumerate(texts):
        vector = embedding(text, dimensions)
        value: Any = vector
        if request.encoding_format == "base64":
            value = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = sum(len(tokenize(text)) for text in texts)
    return _encode(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def rerank_body(request: RerankRequest, model: str) -> bytes:
    _bounded(len(request.documents), "documents")
    scored = [
        (index, document, (similarity(request.query, document) + 1) / 2)
        for index, document in enumerate(request.documents)
    ]
    scored.sort(key=lambda item: -item[2])
    if request.top_n is not None:
        if request.top_n < 1:
            raise invalid_request("`top_n` must be at least 1.", param="top_n")
        scored = scored[: request.top_n]
    tokens = len(tokenize(request.query)) * len(request.documents) + sum(
        len(tokenize(document)) for document in request.documents
    )
    return _encode(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": model,
            "usage": {"total_tokens": tokens},
            "results": [
                {"index": index, "document": {"text": document}, "relevance_score": score}
                for index, document, score in scored
            ],
        }
    )


def score_body(request: ScoreRequest, model: str) -> bytes:
    firsts = [request.text_1] if isinstance(request.text_1, str) else request.text_1
    seconds = [request.text_2] if isinstance(request.text_2, str) else request.text_2
    _bounded(len(seconds), "text_2")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds) or not seconds:
        raise invalid_request(
            "`text_1` must be one text, or as many texts as `text_2`.", param="text_1"
        )
    pairs = list(zip(firsts, seconds, strict=True))
    tokens = sum(len(tokenize(a)) + len(tokenize(b)) for a, b in pairs)
    return _encode(
        {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": [
                {"index": index, "object": "score", "score": (similarity(a, b) + 1) / 2}
                for index, (a, b) in enumerate(pairs)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


class Vocabulary:
    """Ids for words, in the order this process meets them (0 is kept for unknown words)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._words: list[str] = ["<unk>"]

    def tokenize_body(self, request: TokenizeRequest) -> bytes:
        if (request.prompt is None) == (request.messages is None):
            raise invalid_request("Send either `prompt` or `messages`.", param="prompt")
        if request.prompt is not None:
            text = request.prompt
        else:
            assert request.messages is not None
            text = " ".join(
                message.content for message in request.messages if isinstance(message.content, str)
            )
        tokens = [self._id(word) for word in tokenize(text)]
        return _encode({"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens})

    def detokenize_body(self, request: DetokenizeRequest) -> bytes:
        words = []
        for token in request.tokens:
            if not 0 <= token < len(self._words):
                raise invalid_request(f"Unknown token id {token}.", param="tokens")
            words.append(self._words[token])
        return _encode({"prompt": " ".join(words)})

    def _id(self, word: str) -> int:
        known = self._ids.get(word)
        if known is not None:
            return known
        if len(self._words) >= MAX_VOCABULARY:
            return UNKNOWN_ID
        self._ids[word] = len(self._words)
        self._words.append(word)
        return self._ids[word]


def _texts(value: str | list[str | int | list[int]]) -> list[str]:
    if isinstance(value, str):
        return [value]
    _bounded(len(value), "input")
    if not value:
        raise invalid_request("`input` must not be empty.", param="input")
    if all(isinstance(item, int) for item in value):
        return [" ".join(str(token) for token in value)]
    texts: list[str] = []
    for item in value:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, list):
            texts.append(" ".join(str(token) for token in item))
        else:
            raise invalid_request(
                "`input` must be a text, texts, token ids, or lists of token ids.", param="input"
            )
    return texts


def _bounded(count: int, param: str) -> None:
    if count > MAX_INPUTS:
        raise ApiError(400, f"`{param}` has more than {MAX_INPUTS} items.", param=param)
