"""Response bodies and server-sent-event chunks for chat and text completions.

A stream is written as OpenAI writes it: ``data: {json}\\n\\n`` events, a final
``data: [DONE]\\n\\n``, and, when ``stream_options.include_usage`` is set, ``"usage": null``
in every chunk followed by one last chunk with no choices and the usage.
"""

from __future__ import annotations

import time
import uuid
from typing import Protocol

import msgspec
from msgspec import UNSET

from agent.simulator.generation import Generation
from agent.simulator.tokens import output_piece, output_text
from agent.simulator.wire import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    Usage,
)

DONE_EVENT = b"data: [DONE]\n\n"

_encode = msgspec.json.Encoder().encode


class Renderer(Protocol):
    def body(self, output_tokens: int) -> bytes: ...

    def opening(self) -> bytes: ...

    def tokens(self, start: int, stop: int) -> bytes: ...

    def closing(self, output_tokens: int) -> bytes: ...


def renderer_for(generation: Generation, model: str) -> Renderer:
    if generation.kind == "chat":
        return ChatRenderer(generation, model)
    if generation.kind == "responses":
        # Imported here: that module builds on this one's neighbours, not on this one.
        from agent.simulator.responses_api import ResponsesRenderer

        return ResponsesRenderer(generation, model)
    return CompletionRenderer(generation, model)


def _event(payload: msgspec.Struct) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def _usage(generation: Generation, output_tokens: int) -> Usage:
    prompt_tokens = len(generation.prompt)
    return Usage(prompt_tokens, output_tokens, prompt_tokens + output_tokens)


class _Response:
    """What every body and chunk of one response repeats."""

    id_prefix = ""

    def __init__(self, generation: Generation, model: str) -> None:
        self._generation = generation
        self._id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = model
        self._usage_field: msgspec.UnsetType | None = None if generation.include_usage else UNSET


class ChatRenderer(_Response):
    id_prefix = "chatcmpl"

    def body(self, output_tokens: int) -> bytes:
        return _encode(
            ChatCompletion(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[
                    ChatChoice(
                        message=AssistantMessage(content=output_text(output_tokens)),
                        finish_reason=self._generation.finish_reason,
                    )
                ],
                usage=_usage(self._generation, output_tokens),
            )
        )

    def opening(self) -> bytes:
        return self._chunk(ChatDelta(role="assistant", content=""), None)

    def tokens(self, start: int, stop: int) -> bytes:
        return b"".join(
            self._chunk(ChatDelta(content=output_piece(index)), None)
            for index in range(start, stop)
        )

    def closing(self, output_tokens: int) -> bytes:
        closing = self._chunk(ChatDelta(), self._generation.finish_reason)
        if self._generation.include_usage:
            closing += _event(
                ChatCompletionChunk(
                    id=self._id,
                    created=self._created,
                    model=self._model,
                    choices=[],
                    usage=_usage(self._generation, output_tokens),
                )
            )
        return closing + DONE_EVENT

    def _chunk(self, delta: ChatDelta, finish_reason: str | None) -> bytes:
        return _event(
            ChatCompletionChunk(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)],
                usage=self._usage_field,
            )
        )


class CompletionRenderer(_Response):
    """Text completions put the finish reason on the chunk of the last token."""

    id_prefix = "cmpl"

    def body(self, output_tokens: int) -> bytes:
        return _encode(
            Completion(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[
                    CompletionChoice(
                        text=output_text(output_tokens),
                        finish_reason=self._generation.finish_reason,
                    )
                ],
                usage=_usage(self._generation, output_tokens),
            )
        )

    def opening(self) -> bytes:
        return b""

    def tokens(self, start: int, stop: int) -> bytes:
        last = self._generation.max_tokens - 1
        finish_reason = self._generation.finish_reason
        return b"".join(
            self._chunk(output_piece(index), finish_reason if index == last else None)
            for index in range(start, stop)
        )

    def closing(self, output_tokens: int) -> bytes:
        if not self._generation.include_usage:
            return DONE_EVENT
        usage_chunk = Completion(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=[],
            usage=_usage(self._generation, output_tokens),
        )
        return _event(usage_chunk) + DONE_EVENT

    def _chunk(self, text: str, finish_reason: str | None) -> bytes:
        return _event(
            Completion(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
                usage=self._usage_field,
            )
        )
