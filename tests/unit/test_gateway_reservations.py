"""What a request reserves of its key's tpm at admission, as the gateway asks its limiter.

The gateway is driven as the ASGI app it is, with a limiter that notes each reservation
asked for and refuses it (429), so no engine is needed.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.gateway.asgi import KeyCheck, Message
from app.gateway.completions import Completions
from app.gateway.exchange_steps import ExchangeSteps
from app.gateway.metrics import GatewayMetrics
from app.gateway.ratelimit import Quota, RateDecision
from app.gateway.request_body import DEFAULT_OUTPUT_TOKENS
from app.gateway.table import GatewaySnapshot
from tests.support.gateway import new_key

MODEL = "bge-m3"
KEY, RECORD = new_key(tpm=10_000)
SNAPSHOT = GatewaySnapshot(
    declared=frozenset({MODEL}),
    apis={MODEL: frozenset({"chat", "completions", "embeddings", "rerank", "score", "tokenize"})},
    keys={RECORD.prefix: RECORD},
)


class NotingLimiter:
    """Notes the tokens each request would reserve, and refuses it."""

    def __init__(self) -> None:
        self.reserved: list[int] = []

    def admit(
        self, key_id: str, *, rpm: int | None, tpm: int | None, now: float, tokens: int = 1
    ) -> RateDecision:
        self.reserved.append(tokens)
        quota = Quota(limit=tpm or 0, remaining=0, reset_s=1.0)
        return RateDecision(allowed=False, retry_after_s=1.0, requests=None, tokens=quota)

    def record_tokens(self, key_id: str, tokens: int, *, now: float, reserved: int = 0) -> None:
        pass

    async def answered(self, within_s: float) -> None:
        pass


async def reserved_for(path: str, body: bytes) -> int:
    limiter = NotingLimiter()
    completions = Completions(
        ExchangeSteps(
            snapshot=lambda: SNAPSHOT,
            metrics=GatewayMetrics(),
            limiter=limiter,
            keys=KeyCheck(),
            log_requests=False,
        )
    )
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"authorization", b"Bearer " + KEY.encode())],
        "client": ("127.0.0.1", 50000),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await completions(scope, receive, send)
    assert sent[0]["status"] == 429
    (tokens,) = limiter.reserved
    return tokens


BODY = b'{"model":"bge-m3","input":"what is the capital of France?"}'


async def test_a_chat_request_reserves_its_prompt_and_the_most_it_may_generate() -> None:
    chat = b'{"model":"bge-m3","messages":[{"role":"user","content":"hi"}]}'
    assert await reserved_for("/v1/chat/completions", chat) == (
        len(chat) // 4 + DEFAULT_OUTPUT_TOKENS
    )


@pytest.mark.parametrize(
    "path", ["/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/tokenize", "/v1/detokenize"]
)
async def test_a_request_of_an_api_that_generates_nothing_reserves_its_input_alone(
    path: str,
) -> None:
    """An embedding is charged its input's tokens and no more: reserving an answer's 256
    besides made a key's burst of short embeddings refused (429, not to be retried) at a
    tenth of its tpm."""
    assert await reserved_for(path, BODY) == len(BODY) // 4
    with_max = BODY[:-1] + b',"max_tokens":4000}'
    assert await reserved_for(path, with_max) == len(with_max) // 4
