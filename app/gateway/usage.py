"""How many tokens an answer used, for the per-key tokens-per-minute limit, and how many
a stream generated, for the replica's time per output token.

A whole answer carries ``usage``; only that field is decoded. A stream is passed through
untouched, so it is not parsed event by event: the counter watches the bytes go by, counts
the JSON events, and keeps the stream's last few KiB, where the engine puts the usage chunk
when the client asked for it (``stream_options.include_usage``), or, in a Responses API
stream, the ``response.completed`` event with its usage. That event ends with what the
request said after its usage (vLLM echoes the client's ``user``, and the messages in and
out when asked to), which a client can make longer than the tail: so the counter also keeps
the few KiB that follow the stream's last ``"usage"`` key, wherever it is. Without one, each event
counts as one token, which is what a streamed chunk usually carries. An event is a
``data:`` line of a JSON object, with or without the space that SSE allows after the colon,
wherever the engine's pieces of the stream happen to cut it.

The figures are the engine's word, and an engine may be buggy or hostile: each figure read
must be a whole number from 0 to ``MAX_FIGURE``. Usage with any other figure (negative,
fractional, in exponent notation, huge, not a number) is unusable, and the answer's tokens
unknown: a whole answer is then charged what its request reserved at admission
(``Completions``), a stream one token per event, as if it had no usage chunk. A negative
figure would otherwise give a key tokens back (and, across gateways, to every gateway), and
a huge one lock the key out or overflow the count.
"""

from __future__ import annotations

import collections
import re
from typing import Annotated

import msgspec

STREAM_TAIL_BYTES = 4096
"""The usage chunk is the stream's last event before ``[DONE]``; it fits in this many."""
MAX_FIGURE = 1_000_000_000
"""The largest token count believed of one answer: a thousand times the longest contexts
served today, and far inside what every count it is added to can hold."""
_MAX_FIGURE_DIGITS = len(str(MAX_FIGURE))

# A usage object may hold objects of its own before the figure (the Responses API's
# ``input_tokens_details``): one level of them is skipped.
_USAGE = rb'"usage"\s*:\s*\{(?:[^{}]|\{[^{}]*\})*?'
# A figure is taken whole, sign, fraction and exponent included, to be judged by ``_figure``.
_NUMBER = rb"\s*:\s*(-?[0-9][0-9.eE+-]*)"
_TOTAL_TOKENS = re.compile(_USAGE + rb'"total_tokens"' + _NUMBER)
_COMPLETION_TOKENS = re.compile(_USAGE + rb'"(?:completion|output)_tokens"' + _NUMBER)
_SPACED = b"data: {"
_UNSPACED = b"data:{"
"""How a JSON event's line starts: SSE makes the space after the colon optional (an axum
server writes none)."""
_NEWLINE = ord("\n")
_USAGE_KEY = b'"usage"'

Figure = Annotated[int, msgspec.Meta(ge=0, le=MAX_FIGURE)]


class _Usage(msgspec.Struct):
    """The figures of a usage object (chat and completions name the first three, the
    Responses API the last three); each one present must be a ``Figure``."""

    prompt_tokens: Figure | None = None
    completion_tokens: Figure | None = None
    total_tokens: Figure | None = None
    input_tokens: Figure | None = None
    output_tokens: Figure | None = None


class _WithUsage(msgspec.Struct):
    usage: msgspec.Raw = msgspec.Raw(b"null")
    """Kept undecoded until the answer is known to be JSON: an unusable usage is not an
    answer without one."""


_answer_decoder = msgspec.json.Decoder(_WithUsage)
_usage_decoder = msgspec.json.Decoder(_Usage | None)


def usage_of_body(body: bytes) -> int | None:
    """The tokens a whole answer used, by its ``usage.total_tokens``: 0 when it reports none
    (it has no usage or no total, or is no JSON: tokenize's answers, an upload's text);
    ``None`` when its usage is unusable (a figure that is not a ``Figure``)."""
    try:
        raw = _answer_decoder.decode(body).usage
    except (msgspec.DecodeError, RecursionError):
        return 0
    try:
        usage = _usage_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if usage is None or usage.total_tokens is None:
        return 0
    return usage.total_tokens


def _figure(text: bytes) -> int | None:
    """A figure as a stream wrote it, if it is a ``Figure``."""
    if not text.isdigit() or len(text) > _MAX_FIGURE_DIGITS:
        return None
    value = int(text)
    return value if value <= MAX_FIGURE else None


_SEAM_BYTES = len(_USAGE_KEY) - 1
"""The most of an event's start (``data: {``) or a usage key that one piece can end with."""


def _events_across(before: bytes, chunk: bytes) -> int:
    """Events whose start ``before`` (the stream's last bytes) and ``chunk`` share: each
    side is looked at for one byte less than the start has, so none counts twice."""
    found = 0
    for event in (_SPACED, _UNSPACED):
        side = len(event) - 1
        found += (before[-side:] + chunk[:side]).count(event)
    return found


def _usage_across(before: bytes, chunk: bytes) -> bytes:
    """The stream from a usage key that ``before`` and ``chunk`` share on, as far as
    ``chunk`` goes and up to ``STREAM_TAIL_BYTES``; empty if they share none."""
    seam = before + chunk[:_SEAM_BYTES]
    key = seam.find(_USAGE_KEY)
    if key < 0:
        return b""
    return (seam[key:] + chunk[_SEAM_BYTES:])[:STREAM_TAIL_BYTES]


class StreamTokens:
    """Counts the tokens of a stream from its bytes, as they pass.

    Every stream is counted (its output tokens give the replica's time per output token,
    ``app.gateway.traffic``), so ``feed`` costs little: the tail is the last chunks, kept
    as they came, and joined only when read."""

    __slots__ = ("_event", "_events", "_tail", "_tail_bytes", "_usage", "unusable")

    def __init__(self) -> None:
        self._events = 0
        self._event = _SPACED
        """How this stream's events start: one engine writes them all alike, so only the
        one form is looked for, once the stream shows which."""
        self.unusable = False
        """Whether the usage chunk had a figure that is no ``Figure`` (and was ignored)."""
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        """At least the last ``STREAM_TAIL_BYTES`` of the stream, in ``_tail``."""
        self._usage = b""
        """The stream from its last ``"usage"`` key on, up to ``STREAM_TAIL_BYTES``."""

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        event = self._event
        found = chunk.count(event)
        if not found and event is _SPACED and _UNSPACED in chunk:
            event = self._event = _UNSPACED
            found = chunk.count(event)
        tail = self._tail
        before = b""
        if tail and tail[-1][-1] != _NEWLINE:
            # The last piece ended mid-line (rare: an engine writes whole events, but a
            # long one may come in pieces), maybe within an event's start or a usage key.
            before = self._before(_SEAM_BYTES)
            found += _events_across(before, chunk)
        self._events += found
        at = chunk.rfind(_USAGE_KEY)
        if at >= 0:
            self._usage = chunk[at : at + STREAM_TAIL_BYTES]
        elif before and (usage := _usage_across(before, chunk)):
            self._usage = usage
        elif self._usage and len(self._usage) < STREAM_TAIL_BYTES:
            self._usage += chunk[: STREAM_TAIL_BYTES - len(self._usage)]
        tail.append(chunk)
        self._tail_bytes += len(chunk)
        while self._tail_bytes - len(tail[0]) >= STREAM_TAIL_BYTES:
            self._tail_bytes -= len(tail.popleft())

    def _before(self, size: int) -> bytes:
        """The stream's last ``size`` bytes so far (fewer if it is shorter)."""
        before = b""
        for piece in reversed(self._tail):
            before = piece[-size:] + before
            if len(before) >= size:
                break
        return before[-size:]

    def total(self) -> int:
        """The usage chunk's ``total_tokens`` when the stream had a usable one, else one per
        event."""
        return self._found(_TOTAL_TOKENS)

    def output_tokens(self) -> int:
        """The usage chunk's ``completion_tokens`` when the stream had a usable one, else
        one per event (which counts an engine's role-only first event and last event too)."""
        return self._found(_COMPLETION_TOKENS)

    def _found(self, figure: re.Pattern[bytes]) -> int:
        found = figure.findall(self._last_bytes()) or figure.findall(self._usage)
        if not found:
            return self._events
        value = _figure(found[-1])
        if value is None:
            self.unusable = True
            return self._events
        return value

    def _last_bytes(self) -> bytes:
        return b"".join(self._tail)[-STREAM_TAIL_BYTES:]
