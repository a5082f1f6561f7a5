"""The OpenAI-compatible paths the gateway serves, the API of a model's spec each belongs to
(``ModelSpec.apis``), and where each goes on an engine.

A path is served for a model only if its spec names the path's API: any other is 404, in
the same words as a model the key may not use, so a client learns nothing it could not ask
``GET /v1/models``. Engines serve tokenize and detokenize outside ``/v1`` (vLLM's
``/tokenize``, ``/detokenize``); the gateway offers them under ``/v1`` with the rest.
"""

from __future__ import annotations

import msgspec


class Endpoint(msgspec.Struct, frozen=True):
    api: str
    """The API of ``ModelSpec.apis`` the path belongs to."""
    engine_path: str
    """Where the request goes on the engine."""
    generates: bool = False
    """Whether the engine generates an answer's tokens: a tpm limit reserves the most the
    request may generate besides its input (``request_body.token_estimate``)."""


JSON_ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint("chat", "/v1/chat/completions", generates=True),
    "/v1/completions": Endpoint("completions", "/v1/completions", generates=True),
    "/v1/embeddings": Endpoint("embeddings", "/v1/embeddings"),
    "/v1/responses": Endpoint("responses", "/v1/responses", generates=True),
    "/v1/rerank": Endpoint("rerank", "/v1/rerank"),
    "/v1/score": Endpoint("score", "/v1/score"),
    "/v1/tokenize": Endpoint("tokenize", "/tokenize"),
    "/v1/detokenize": Endpoint("tokenize", "/detokenize"),
}
"""Requests whose JSON body names the model (``app.gateway.completions``)."""

UPLOAD_ENDPOINTS: dict[str, Endpoint] = {
    "/v1/audio/transcriptions": Endpoint("transcriptions", "/v1/audio/transcriptions"),
    "/v1/audio/translations": Endpoint("translations", "/v1/audio/translations"),
}
"""Requests whose multipart form names the model before its file (``app.gateway.uploads``)."""
