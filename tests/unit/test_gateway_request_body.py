"""The gateway's own 400 for a body it cannot route names the field at fault as OpenAI's
``param``, which the ``openai`` SDKs expose as ``BadRequestError.param``."""

from __future__ import annotations

import pytest

from app.gateway.errors import ApiError
from app.gateway.request_body import parse_fields


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": 7}', "model"),
        (b'{"model": null}', "model"),
        (b'{"model": ""}', "model"),
        (b'{"messages": []}', "model"),
        (b'{"model": "m", "stream": "yes"}', "stream"),
        (b'{"model": "m", "stream": {"nested": true}}', "stream"),
    ],
)
def test_a_wrong_routing_field_is_named_as_the_param(body: bytes, param: str) -> None:
    with pytest.raises(ApiError) as raised:
        parse_fields(body)
    error = raised.value
    assert (error.status, error.type, error.code) == (400, "invalid_request_error", None)
    assert error.param == param
    assert param in error.message


@pytest.mark.parametrize(
    "body", [b"[1, 2]", b'"model"', b"{not json", b"", b"[" * 5000 + b"]" * 5000]
)
def test_a_body_that_is_no_object_names_no_param(body: bytes) -> None:
    with pytest.raises(ApiError) as raised:
        parse_fields(body)
    assert (raised.value.status, raised.value.param) == (400, None)


def test_the_fields_of_a_good_body_are_read() -> None:
    fields = parse_fields(b'{"model": "org/m", "stream": true, "messages": [{"x": 1}]}')
    assert (fields.model, fields.stream) == ("org/m", True)


@pytest.mark.parametrize(
    ("body", "escape", "at"),
    [
        # A high surrogate alone: msgspec said "Input data was truncated" of a whole body.
        (rb'{"model": "m", "messages": [{"role": "user", "content": "\ud800"}]}', "d800", 57),
        (rb'{"model": "\uDBFF"}', "DBFF", 11),
        (rb'{"model": "m", "x": "\ud800\u0041"}', "d800", 21),  # followed by no low one
        (rb'{"model": "m", "x": "\ud800\ud800"}', "d800", 21),
        (rb'{"model": "m", "x": "\udc00 "}', "dc00", 21),  # a low surrogate alone
        (rb'{"model": "m", "x": "\\\\\udc00"}', "dc00", 25),  # after an escaped backslash
    ],
)
def test_an_unpaired_surrogate_escape_is_named_with_where_it_is(
    body: bytes, escape: str, at: int
) -> None:
    with pytest.raises(ApiError) as raised:
        parse_fields(body)
    error = raised.value
    assert (error.status, error.type, error.param) == (400, "invalid_request_error", None)
    assert error.message == (
        f"The request body is not valid JSON: `\\u{escape}` at byte {at} is an unpaired UTF-16 "
        "surrogate escape (a \\ud800-\\udbff escape must be followed by a \\udc00-\\udfff "
        "one); send the character as UTF-8, or as both escapes of its pair."
    )


@pytest.mark.parametrize(
    "body",
    [
        rb'{"model": "m", "x": "\ud83d\ude00"}',  # a pair: one character
        rb'{"model": "m", "x": "\\ud800"}',  # an escaped backslash, then text
    ],
)
def test_a_surrogate_pair_or_an_escaped_backslash_is_no_unpaired_surrogate(body: bytes) -> None:
    assert parse_fields(body).model == "m"


def test_a_body_broken_before_its_unpaired_surrogate_is_told_its_first_fault() -> None:
    with pytest.raises(ApiError) as raised:
        parse_fields(rb'{"model": "m", "x": "\u12", "y": "\ud800"}')
    assert "invalid character in unicode escape" in raised.value.message
    assert "surrogate" not in raised.value.message
