"""From an OpenAI request body to prompt tokens and limits, and the errors on the way."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from agent.simulator.errors import ApiError, error_body, model_not_found
from agent.simulator.generation import (
    DEFAULT_MAX_TOKENS,
    Generation,
    parse_chat,
    parse_completion,
    parse_responses,
)
from agent.simulator.tokens import output_piece, output_text, tokenize

MODEL = "sim-model"


def body(payload: object) -> bytes:
    return msgspec.json.encode(payload)


def test_the_tokenizer_counts_whitespace_separated_words() -> None:
    assert tokenize("  Hello,\tbig\n world ") == ("Hello,", "big", "world")


def test_the_output_is_the_same_filler_words_every_time() -> None:
    assert output_text(3) == "the quick brown"
    assert "".join(output_piece(index) for index in range(20)) == output_text(20)


def test_a_chat_prompt_is_every_message_joined() -> None:
    generation = parse_chat(
        body(
            {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
                ],
            }
        ),
        MODEL,
    )

    assert generation.prompt == ("be", "brief", "hello", "there")
    assert generation.max_tokens == DEFAULT_MAX_TOKENS
    assert not generation.stream


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    generation = parse_chat(
        body(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
                "max_completion_tokens": 7,
                "ignore_eos": True,
            }
        ),
        MODEL,
    )

    assert generation.max_tokens == 7


def test_usage_is_streamed_only_when_asked_for_on_a_stream() -> None:
    def include_usage(stream: bool, options: dict[str, bool] | None) -> bool:
        payload = {"model": MODEL, "prompt": "hi", "stream": stream, "stream_options": options}
        return parse_completion(body(payload), MODEL).include_usage

    assert include_usage(True, {"include_usage": True})
    assert not include_usage(True, None)
    assert not include_usage(True, {})


@pytest.mark.parametrize("parse", [parse_chat, parse_completion])
@pytest.mark.parametrize(
    "options", [{"include_usage": True}, {"include_usage": False}, {"continuous_usage_stats": True}]
)
def test_stream_options_on_a_request_not_streamed_is_a_400_as_vllm_answers_it(
    parse: Callable[[bytes, str], Generation], options: dict[str, bool]
) -> None:
    """vLLM refuses it (``validate_stream_options``); the simulator answered it, so a
    client that sends it met the 400 only in production."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    for stream in (False, None):
        with pytest.raises(ApiError) as raised:
            parse(body(chat | {"stream": stream, "stream_options": options}), MODEL)
        error = raised.value
        assert (error.status, error.param) == (400, "stream_options")
        assert error.message == "Stream options can only be defined when `stream=True`."
    # Nothing to refuse: null, or an empty object (falsy where vLLM checks it).
    for nothing in (None, {}):
        assert not parse(body(chat | {"stream_options": nothing}), MODEL).stream


def test_null_for_an_optional_field_is_taken_as_not_given_as_vllm_takes_it() -> None:
    """OpenAI's SDKs and vLLM read ``"stream": null`` as a request that is not streamed;
    the simulator answered it 400 ("Expected `bool`, got `null`")."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    nulls = {"stream": None, "n": None, "max_tokens": None, "stream_options": None}

    generation = parse_chat(body(chat | nulls), MODEL)
    completion = parse_completion(body({"model": MODEL, "prompt": "hi", "stream": None}), MODEL)
    responses = parse_responses(body({"model": MODEL, "input": "hi", "stream": None}), MODEL)

    assert (generation.stream, generation.max_tokens) == (False, DEFAULT_MAX_TOKENS)
    assert not completion.stream
    assert not responses.stream
    unasked = {"stream": True, "stream_options": {"include_usage": None}}
    assert not parse_chat(body(chat | unasked), MODEL).include_usage


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"prompt": "hi", "n": None}, "$.n"),
        ({"prompt": "hi", "ignore_eos": None}, "$.ignore_eos"),
    ],
)
def test_null_where_vllm_refuses_it_is_still_a_400(payload: dict[str, object], field: str) -> None:
    with pytest.raises(ApiError) as raised:
        parse_completion(body({"model": MODEL} | payload), MODEL)

    assert raised.value.status == 400
    assert field in raised.value.message


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [("one two three", 3), (["one two"], 2), ([101, 102, 103, 104], 4)],
)
def test_a_completion_prompt_may_be_text_or_token_ids(prompt: object, tokens: int) -> None:
    generation = parse_completion(body({"model": MODEL, "prompt": prompt}), MODEL)

    assert len(generation.prompt) == tokens


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"model": "sim-model", "messages": [', "not valid JSON"),
        (body({"messages": []}), "missing required field `model`"),
        (body({"model": MODEL}), "missing required field `messages`"),
        (body({"model": MODEL, "messages": [], "max_tokens": 0}), "at least 1"),
        (body({"model": MODEL, "messages": [], "n": 2}), "n=1"),
    ],
)
def test_a_malformed_chat_request_is_a_400(payload: bytes, message: str) -> None:
    with pytest.raises(ApiError) as raised:
        parse_chat(payload, MODEL)

    assert raised.value.status == 400
    assert message in raised.value.message


def test_a_responses_request_streams_without_usage_options_and_names_its_own_limit() -> None:
    generation = parse_responses(body({"model": MODEL, "input": "hi", "stream": True}), MODEL)

    assert (generation.kind, generation.max_tokens, generation.stream) == (
        "responses",
        DEFAULT_MAX_TOKENS,
        True,
    )
    assert (generation.include_usage, generation.ignore_eos) == (False, False)
    with pytest.raises(ApiError) as raised:
        parse_responses(body({"model": MODEL, "input": "hi", "max_output_tokens": 0}), MODEL)
    assert (raised.value.status, raised.value.param) == (400, "max_output_tokens")


def test_a_request_for_more_than_one_choice_is_refused_before_its_limit_is_read() -> None:
    with pytest.raises(ApiError) as raised:
        parse_completion(body({"model": MODEL, "prompt": "hi", "n": 2, "max_tokens": 0}), MODEL)

    assert (raised.value.status, raised.value.param) == (400, "n")


def test_a_request_for_another_model_is_a_404() -> None:
    with pytest.raises(ApiError) as raised:
        parse_completion(body({"model": "gpt-4", "prompt": "hi"}), MODEL)

    assert (raised.value.status, raised.value.code, raised.value.param) == (
        404,
        "model_not_found",
        "model",
    )


def test_errors_can_be_written_in_three_styles() -> None:
    error = model_not_found("gpt-4")

    assert msgspec.json.decode(error_body(error, "openai")) == {
        "error": {
            "message": "The model `gpt-4` does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert msgspec.json.decode(error_body(error, "flat")) == {
        "detail": "The model `gpt-4` does not exist."
    }
    assert msgspec.json.decode(error_body(error, "message")) == {
        "object": "error",
        "message": "The model `gpt-4` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": 404,
    }


@pytest.mark.parametrize(
    ("parse", "field", "value"),
    [
        (parse_chat, "temperature", "hot"),
        (parse_chat, "top_p", "most"),
        (parse_chat, "max_tokens", "16"),
        (parse_chat, "n", 1.5),
        (parse_chat, "seed", "42"),
        (parse_chat, "stop", 7),
        (parse_chat, "presence_penalty", "some"),
        (parse_completion, "temperature", "hot"),
        (parse_completion, "stop", [7]),
        (parse_completion, "frequency_penalty", True),
        (parse_responses, "temperature", "hot"),
        (parse_responses, "top_p", [1]),
    ],
)
def test_a_sampling_field_of_the_wrong_type_is_a_400_naming_it_as_vllm_answers_it(
    parse: Callable[[bytes, str], Generation], field: str, value: object
) -> None:
    # Before, a sampling field the simulator does not use was ignored whatever it held, and
    # the request answered 200 where vLLM's request validation answers 400.
    payload = {
        parse_chat: {"messages": [{"role": "user", "content": "hi"}]},
        parse_completion: {"prompt": "hi"},
        parse_responses: {"input": "hi"},
    }[parse]

    with pytest.raises(ApiError) as raised:
        parse(body({"model": MODEL, **payload, field: value}), MODEL)

    assert (raised.value.status, raised.value.type) == (400, "invalid_request_error")
    assert raised.value.param in (field, f"{field}[0]")
    assert f"`$.{field}" in raised.value.message
    assert msgspec.json.decode(error_body(raised.value, "openai"))["error"]["param"] == (
        raised.value.param
    )


def test_sampling_fields_of_the_right_type_or_null_are_taken_and_ignored() -> None:
    sampled = {
        "temperature": 0,
        "top_p": 0.9,
        "seed": 42,
        "stop": ["\n"],
        "presence_penalty": None,
        "frequency_penalty": 0.5,
    }
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    assert parse_chat(body(chat | sampled), MODEL) == parse_chat(body(chat), MODEL)
    completion = {"model": MODEL, "prompt": "hi", "stop": "."}
    assert parse_completion(body(completion), MODEL).max_tokens == DEFAULT_MAX_TOKENS


def test_a_field_missing_from_a_message_is_named_by_its_path() -> None:
    with pytest.raises(ApiError) as raised:
        parse_chat(body({"model": MODEL, "messages": [{"content": "hi"}]}), MODEL)

    assert raised.value.param == "messages[0].role"
