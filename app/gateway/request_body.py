"""What the gateway reads of a request whose JSON body names the model: the body itself
(bounded, without a leading byte order mark), the few fields it routes and limits by
(``RoutingFields``, one msgspec decode; the engine reads the rest, byte for byte), and the
tokens a tpm limit reserves for it until its usage is known (``token_estimate``).
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from app.gateway.asgi import Receive
from app.gateway.errors import body_too_large, invalid_request
from app.listeners.bom import LeadingMark, without_mark

MAX_BODY_BYTES = 32 * 1024 * 1024
BYTES_PER_TOKEN = 4
"""For the estimate of a prompt's tokens from its body: about four bytes of English each."""
DEFAULT_OUTPUT_TOKENS = 256
"""Reserved for the answer of a request that says no maximum."""

_ABSENT = msgspec.Raw(b"null")
"""A count field the body leaves out: this very object (``is``), never decoded."""


class RoutingFields(msgspec.Struct):
    """What the gateway reads of a request body; the engine reads the rest."""

    model: str
    stream: bool | None = None
    max_tokens: msgspec.Raw = _ABSENT
    max_completion_tokens: msgspec.Raw = _ABSENT
    max_output_tokens: msgspec.Raw = _ABSENT
    """Kept undecoded, read only for a tpm limit's reservation (``token_estimate``): the
    engine checks them."""


_decode_fields = msgspec.json.Decoder(RoutingFields).decode
_decode_count = msgspec.json.Decoder(Annotated[int, msgspec.Meta(ge=0)]).decode


class ClientGoneBeforeBody(Exception):
    """The client disconnected before its request body arrived."""


def token_estimate(fields: RoutingFields, body_bytes: int, *, generates: bool) -> int:
    """The tokens a tpm limit reserves for a request until its usage is known: its input,
    and, for an API that ``generates``, the most it may generate."""
    if not generates:
        return body_bytes // BYTES_PER_TOKEN  # an embedding, a score: input tokens alone
    output = DEFAULT_OUTPUT_TOKENS
    for raw in (fields.max_completion_tokens, fields.max_tokens, fields.max_output_tokens):
        if raw is _ABSENT:
            continue  # left out: an exception per absent field would cost more than the rest
        try:
            output = _decode_count(raw)
            break
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # absent, null or not a count: the engine says what is wrong with it
    return body_bytes // BYTES_PER_TOKEN + output


def parse_fields(body: bytes) -> RoutingFields:
    """The body's ``RoutingFields``; 400 for a body that is not a JSON object naming a
    model, or that nests too deeply to read. An empty ``model`` is refused here, as an
    upload's is, rather than looked up: "the model `` does not exist" would leave the
    client to guess that it sent none."""
    try:
        fields = _decode_fields(body)
    except msgspec.ValidationError as exc:
        raise invalid_request(f"Invalid request body: {exc}", param=_param_of(exc)) from None
    except msgspec.DecodeError as exc:
        if not body.strip():
            # msgspec would say "truncated", as if the client had cut its body short.
            raise invalid_request(
                "The request body is empty: send a JSON object with `model`."
            ) from None
        fault = _json_fault(body, exc)
        raise invalid_request(f"The request body is not valid JSON: {fault}") from None
    except RecursionError:
        # Catching the decoder's own limit costs nothing on the requests that stay under it;
        # a scan for depth beforehand would cost every request a second pass over its body.
        raise invalid_request(
            "The request body nests arrays and objects too deeply for the gateway to read "
            "(about 1,000 levels); no OpenAI request comes close."
        ) from None
    if not fields.model:
        raise invalid_request(
            "The request body's `model` is empty: name the model to use "
            "(GET /v1/models lists those your key may use).",
            param="model",
        )
    return fields


def _json_fault(body: bytes, exc: msgspec.DecodeError) -> str:
    """What is wrong with a ``body`` msgspec could not decode: its own words, unless an
    unpaired surrogate escape comes first, of which it says "Input data was truncated" (of a
    body that is whole) or names only the byte after it. Only a refused body is scanned."""
    unpaired = unpaired_surrogate(body)
    if unpaired is None:
        return str(exc)
    at, escape = unpaired
    reported = _BYTE_AT.search(str(exc))
    if reported is not None and int(reported.group(1)) < at:
        return str(exc)  # a fault before it: the first is the one to fix
    return (
        f"`\\u{escape}` at byte {at} is an unpaired UTF-16 surrogate escape (a \\ud800-\\udbff "
        "escape must be followed by a \\udc00-\\udfff one); send the character as UTF-8, or "
        "as both escapes of its pair."
    )


_BYTE_AT = re.compile(r"\(byte (\d+)\)$")
"""Where msgspec says a body went wrong: ``JSON is malformed: ... (byte 27)``."""

_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
"""A backslash escape, taken left to right so that an escaped backslash (``\\\\``) is one
escape and the ``u`` after it is text; group 1: the four hex digits of a ``\\u`` escape."""


def unpaired_surrogate(body: bytes) -> tuple[int, str] | None:
    """The first ``\\u`` escape in ``body`` of a UTF-16 surrogate without its other half (a
    high one, ``d800``-``dbff``, not followed at once by a low one, ``dc00``-``dfff``, or a
    low one alone): where its backslash is (the byte offset, from 0, as msgspec counts) and
    its four hex digits as sent. None when every surrogate escape is paired. No text
    decodes to a lone surrogate, so JSON holding one is no Unicode text (RFC 8259 8.2)."""
    high: re.Match[bytes] | None = None
    for escape in _ESCAPE.finditer(body):
        digits = escape.group(1)
        unit = -1 if digits is None else int(digits, 16)
        if high is not None:
            if escape.start() == high.end() and 0xDC00 <= unit <= 0xDFFF:
                high = None
                continue
            break
        if 0xD800 <= unit <= 0xDBFF:
            high = escape
        elif 0xDC00 <= unit <= 0xDFFF:
            return escape.start(), digits.decode()
    if high is None:
        return None
    return high.start(), high.group(1).decode()


_FIELD_AT = re.compile(r"- at `\$\.([a-z_]+)`$|missing required field `([a-z_]+)`$")
"""Where msgspec says a field of ``RoutingFields`` is wrong: ``... - at `$.model``` (a
wrong type) or ``Object missing required field `model```."""


def _param_of(exc: msgspec.ValidationError) -> str | None:
    """The top-level field a validation error is about, as OpenAI's ``param`` names it
    (``"model"``, ``"stream"``); None for a body that is no object at all."""
    found = _FIELD_AT.search(str(exc))
    if found is None:
        return None
    return found.group(1) or found.group(2)


async def read_body(receive: Receive) -> bytes:
    """The request's body, without the byte order mark it may start with
    (``app.listeners.bom``): the engine gets the JSON alone. 413 past ``MAX_BODY_BYTES``."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGoneBeforeBody
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return without_mark(body)
    mark = LeadingMark()
    chunks = [mark.feed(body, more=True)]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGoneBeforeBody
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise body_too_large(MAX_BODY_BYTES)
        more = message.get("more_body", False)
        chunks.append(mark.feed(chunk, more=more))
        if not more:
            return b"".join(chunks)
