"""OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, which every
OpenAI client parses.

The gateway answers every refusal in it and rewrites what engines send into it
(``app.gateway.errors``); the engine simulator answers in it unless told to answer in
another engine's style (``agent.simulator.errors``). It lives here because ``wire`` is the
one package both may import (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import msgspec


class ErrorDetail(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    error: ErrorDetail
