"""Which engine errors say the prompt does not fit the model's context.

OpenAI answers such a request 400 with ``code: "context_length_exceeded"`` and
``param: "messages"``, and applications (LangChain, LlamaIndex, agent frameworks) branch on
that code to shorten the conversation and send it again. Engines say the same thing each
in their own words; ``is_context_overflow`` recognises them, so that
``app.gateway.engine_error_body`` can give the client OpenAI's code with the engine's
message. Only a 4xx is one: a 5xx that mentions a context is an engine failing.
"""

from __future__ import annotations

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CONTEXT_LENGTH_PARAM = "messages"

ENGINE_OVERFLOW_TYPES = frozenset({"exceed_context_size_error"})
"""llama.cpp's server: ``{"error": {"code": 400, "message": "request (N tokens) exceeds
the available context size (M tokens), try increasing it", "type":
"exceed_context_size_error", "n_prompt_tokens": N, "n_ctx": M}}``."""

ENGINE_OVERFLOW_PHRASES = (
    # vLLM, every release ("This model's maximum context length is N tokens. However, you
    # requested M tokens ...", "... and your request has M input tokens", "... your prompt
    # contains at least M input tokens ..."), and SGLang's newer "Requested token count
    # exceeds the model's maximum context length of N tokens".
    "maximum context length",
    # SGLang: "The input (M tokens) is longer than the model's context length (N tokens)."
    "is longer than the model's context length",
    # llama.cpp's server, older releases without the type: "the request exceeds the
    # available context size, try increasing it".
    "exceeds the available context size",
    # text-generation-inference: "Input validation error: `inputs` tokens +
    # `max_new_tokens` must be <= N. Given: ..." and "`inputs` must have less than N tokens".
    "`inputs` tokens + `max_new_tokens` must be",
    "`inputs` must have less than",
)


def is_context_overflow(status: int, kind: object, message: str) -> bool:
    """Whether an engine's error (its ``status``, its own ``type``, its message) says the
    request is over the model's context."""
    if not 400 <= status <= 499:
        return False
    if isinstance(kind, str) and kind in ENGINE_OVERFLOW_TYPES:
        return True
    lowered = message.lower()
    return any(phrase in lowered for phrase in ENGINE_OVERFLOW_PHRASES)
