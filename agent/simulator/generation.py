"""Turn an OpenAI request body into what the engine needs: prompt tokens and limits."""

from __future__ import annotations

import re
from typing import Literal, TypeVar

import msgspec

from agent.simulator.errors import invalid_request, model_not_found
from agent.simulator.tokens import tokenize, tokenize_ids
from agent.simulator.wire import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    InputMessage,
    ResponsesRequest,
)

DEFAULT_MAX_TOKENS = 16
_ERROR_PATH = re.compile(r" - at `\$(.*)`$")
_MISSING_FIELD = re.compile(r"Object missing required field `([^`]+)`")

Kind = Literal["chat", "completion", "responses"]
_Request = TypeVar("_Request", ChatCompletionRequest, CompletionRequest, ResponsesRequest)


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    kind: Kind
    prompt: tuple[str, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool = False
    finish_reason: str = "length"

    def ending_at_eos(self, eos_after_tokens: int | None) -> Generation:
        """This generation as it runs on an engine whose model emits its end-of-sequence
        token after ``eos_after_tokens`` tokens: shorter, finishing with ``stop``, unless
        the request asked to ignore it."""
        if self.ignore_eos or eos_after_tokens is None or eos_after_tokens >= self.max_tokens:
            return self
        return msgspec.structs.replace(self, max_tokens=eos_after_tokens, finish_reason="stop")


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_responses_decoder = msgspec.json.Decoder(ResponsesRequest)


def parse_chat(body: bytes, served_model: str) -> Generation:
    request = _decode(_chat_decoder, body)
    _check_model(request.model, served_model)
    max_tokens = request.max_completion_tokens
    if max_tokens is None:
        max_tokens = request.max_tokens
    prompt = tokenize(" ".join(_message_text(message) for message in request.messages))
    return _sampled("chat", prompt, max_tokens, request)


def parse_completion(body: bytes, served_model: str) -> Generation:
    request = _decode(_completion_decoder, body)
    _check_model(request.model, served_model)
    prompt = request.prompt
    if isinstance(prompt, str):
        tokens = tokenize(prompt)
    elif all(isinstance(item, int) for item in prompt):
        tokens = tokenize_ids([item for item in prompt if isinstance(item, int)])
    elif len(prompt) == 1 and isinstance(prompt[0], str):
        tokens = tokenize(prompt[0])
    else:
        raise invalid_request(
            "`prompt` must be a string, a list of one string, or a list of token ids",
            param="prompt",
        )
    return _sampled("completion", tokens, request.max_tokens, request)


def parse_responses(body: bytes, served_model: str) -> Generation:
    """A Responses API request: its instructions and input messages are the prompt."""
    request = _decode(_responses_decoder, body)
    _check_model(request.model, served_model)
    if isinstance(request.input, str):
        text = request.input
    else:
        text = " ".join(_input_text(item) for item in request.input)
    if request.instructions:
        text = f"{request.instructions} {text}"
    return _generation(
        "responses", tokenize(text), request.max_output_tokens, stream=bool(request.stream)
    )


def _input_text(item: InputMessage) -> str:
    content = item.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(part.text for part in content if part.text)


def _decode(decoder: msgspec.json.Decoder[_Request], body: bytes) -> _Request:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise invalid_request(f"Invalid request body: {exc}", param=_field(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from exc


def _field(validation_error: str) -> str | None:
    """The field a msgspec validation error is about, as OpenAI's ``param`` names it
    (``temperature``, ``messages[0].role``); None when it names none."""
    at = _ERROR_PATH.search(validation_error)
    path = at.group(1).removeprefix(".") if at else ""
    missing = _MISSING_FIELD.match(validation_error)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def _check_model(requested: str, served_model: str) -> None:
    if requested != served_model:
        raise model_not_found(requested)


def _message_text(message: ChatMessage) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(part.text for part in content if part.type == "text" and part.text)


def _sampled(
    kind: Kind,
    prompt: tuple[str, ...],
    max_tokens: int | None,
    request: ChatCompletionRequest | CompletionRequest,
) -> Generation:
    """A chat or completion request's generation, with the options both kinds share."""
    if request.n not in (1, None):  # null: not given, one choice
        raise invalid_request("Only n=1 is supported.", param="n")
    stream = bool(request.stream)  # null: not streamed
    options = request.stream_options
    if options is not None and options.names_any() and not stream:
        # vLLM's validate_stream_options, in these words: a client tested against the
        # simulator must not meet this only in production.
        raise invalid_request(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    return _generation(
        kind,
        prompt,
        max_tokens,
        stream=stream,
        include_usage=stream and options is not None and bool(options.include_usage),
        ignore_eos=request.ignore_eos,
    )


def _generation(
    kind: Kind,
    prompt: tuple[str, ...],
    max_tokens: int | None,
    *,
    stream: bool,
    include_usage: bool = False,
    ignore_eos: bool = False,
) -> Generation:
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if max_tokens < 1:
        param = "max_output_tokens" if kind == "responses" else "max_tokens"
        raise invalid_request(f"`{param}` must be at least 1.", param=param)
    return Generation(
        kind=kind,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=ignore_eos,
    )
