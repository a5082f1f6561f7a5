"""Errors the simulator answers with, and the three body styles it can write them in.

``openai`` (default) writes ``{"error": {"message", "type", "param", "code"}}`` as the
OpenAI API does; ``flat`` writes ``{"detail": "..."}`` as FastAPI-based servers do;
``message`` writes ``{"object": "error", "message", "type", "param", "code"}`` with the
HTTP status as ``code``, as older vLLM releases do. A gateway that normalises engine
errors can be tested against each.
"""

from __future__ import annotations

import msgspec

from agent.simulator.config import ErrorStyle
from wire.openai_error import ErrorBody, ErrorDetail


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param


def invalid_request(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def context_length_exceeded(context: int, prompt_tokens: int, max_tokens: int) -> ApiError:
    """A prompt and output over the model's ``context``, in vLLM's words (0.10 and later,
    ``vllm/entrypoints/openai/serving_engine.py``): a prompt that alone fills it, or one
    that leaves too little for ``max_tokens``."""
    head = f"This model's maximum context length is {context} tokens."
    if prompt_tokens >= context:
        message = f"{head} However, your request has {prompt_tokens} input tokens."
    else:
        message = (
            f"{head} However, you requested {max_tokens} output tokens and your prompt "
            f"contains {prompt_tokens} input tokens, for a total of "
            f"{prompt_tokens + max_tokens} tokens. Please reduce the length of the input "
            "prompt or the number of requested output tokens."
        )
    return ApiError(400, message, param="input_tokens")


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist.",
        code="model_not_found",
        param="model",
    )


def not_ready() -> ApiError:
    return ApiError(503, "The engine is starting.", type="server_error", code="not_ready")


class _FlatError(msgspec.Struct, frozen=True):
    detail: str


class _MessageError(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None
    code: int
    object: str = "error"


def error_body(error: ApiError, style: ErrorStyle) -> bytes:
    body: ErrorBody | _FlatError | _MessageError
    if style == "openai":
        body = ErrorBody(ErrorDetail(error.message, error.type, error.param, error.code))
    elif style == "flat":
        body = _FlatError(error.message)
    else:
        body = _MessageError(error.message, error.type, error.param, error.status)
    return msgspec.json.encode(body)
