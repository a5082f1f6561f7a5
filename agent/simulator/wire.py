"""OpenAI request and response bodies, as msgspec structs.

Requests accept and ignore fields the simulator has no use for, as engines do; the
sampling fields among them (temperature, top_p, seed, stop, ...) are declared all the same,
so that one of the wrong type (``"temperature": "hot"``) is a 400 naming it, as vLLM's
validation answers it. An optional field vLLM takes ``null`` for is taken as not given
(``"stream": null`` is not streamed, as OpenAI's SDKs and vLLM read it): chat's ``stream``,
``n`` and ``stream_options.include_usage``, completions' and the Responses API's
``stream``; one vLLM refuses ``null`` for (``ignore_eos``, completions' ``n``) is a 400
here too, as is ``stream_options`` with a field on a request not streamed. Response fields
appear exactly as OpenAI writes them, ``null`` included; a field left ``UNSET`` is not
written at all.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool | UnsetType | None = UNSET
    continuous_usage_stats: bool | UnsetType | None = UNSET
    """vLLM's own option; read only to know whether the object names anything."""

    def names_any(self) -> bool:
        """Whether the object has a field: vLLM refuses one on a request not streamed
        (``{}`` passes, as a dict that is empty is falsy there)."""
        return self.include_usage is not UNSET or self.continuous_usage_stats is not UNSET


class ContentPart(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str | list[ContentPart] | None = None


class _SamplingFields(msgspec.Struct, frozen=True, kw_only=True):
    """Sampling fields the simulator does not use, declared so that one of the wrong type
    is refused with 400 as vLLM refuses it, not ignored."""

    temperature: float | None = None
    top_p: float | None = None


class _GenerationRequest(_SamplingFields, frozen=True, kw_only=True):
    model: str
    max_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ChatCompletionRequest(_GenerationRequest, frozen=True, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    n: int | None = 1


class CompletionRequest(_GenerationRequest, frozen=True, kw_only=True):
    prompt: str | list[str | int]
    n: int = 1


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: str = "assistant"
    content: str


class ChatChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(msgspec.Struct, frozen=True, omit_defaults=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | UnsetType | None = UNSET


class CompletionChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET


class ModelCard(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "llmgw-sim"


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


# -- the Responses API ---------------------------------------------------------------------


class InputPart(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class InputMessage(msgspec.Struct, frozen=True):
    role: str = "user"
    content: str | list[InputPart] | None = None
    type: str = "message"


class ResponsesRequest(_SamplingFields, frozen=True, kw_only=True):
    model: str
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool | None = False


# -- embeddings, rerank, score, tokenize ---------------------------------------------------


class EmbeddingsRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    input: str | list[str | int | list[int]]
    """A text, texts, token ids, or lists of token ids."""
    dimensions: int | None = None
    encoding_format: str = "float"


class RerankRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None


class ScoreRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    text_1: str | list[str]
    text_2: str | list[str]


class TokenizeRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class DetokenizeRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    tokens: list[int]
