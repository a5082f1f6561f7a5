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
