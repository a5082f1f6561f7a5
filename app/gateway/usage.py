"""How many tokens an answer used, for the per-key tokens-per-minute limit, and how many
a stream generated, for the replica's time per output token.

A whole answer carries ``usage``; only that field is decoded. A stream is passed through
untouched, so it is not parsed event by event: the counter watches the bytes go by, counts
the JSON events, and keeps the stream's last few KiB, where the engine puts the usage chunk
when the client asked for it (``stream_options.include_usage``), or, in a Responses API
stream, the ``response.completed`` event with its usage. Without one, each event
counts as one token, which is what a streamed chunk usually carries.
"""

from __future__ import annotations

import collections
import re

import msgspec

STREAM_TAIL_BYTES = 4096
"""The usage chunk is the stream's last event before ``[DONE]``; it fits in this many."""

# A usage object may hold objects of its own before the figure (the Responses API's
# ``input_tokens_details``): one level of them is skipped.
_USAGE = rb'"usage"\s*:\s*\{(?:[^{}]|\{[^{}]*\})*?'
_TOTAL_TOKENS = re.compile(_USAGE + rb'"total_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(_USAGE + rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
_EVENT = b"data: {"


class _Usage(msgspec.Struct):
    total_tokens: int = 0


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_usage_decoder = msgspec.json.Decoder(_WithUsage)


def usage_of_body(body: bytes) -> int | None:
    """``usage.total_tokens`` of a whole answer, or ``None`` when it has none."""
    try:
        usage = _usage_decoder.decode(body).usage
    except (msgspec.DecodeError, RecursionError):
        return None
    return None if usage is None else usage.total_tokens


class StreamTokens:
    """Counts the tokens of a stream from its bytes, as they pass.

    Every stream is counted (its output tokens give the replica's time per output token,
    ``app.gateway.traffic``), so ``feed`` costs little: the tail is the last chunks, kept
    as they came, and joined only when read."""

    __slots__ = ("_events", "_tail", "_tail_bytes")

    def __init__(self) -> None:
        self._events = 0
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        """At least the last ``STREAM_TAIL_BYTES`` of the stream, in ``_tail``."""

    def feed(self, chunk: bytes) -> None:
        self._events += chunk.count(_EVENT)
        tail = self._tail
        tail.append(chunk)
        self._tail_bytes += len(chunk)
        while self._tail_bytes - len(tail[0]) >= STREAM_TAIL_BYTES:
            self._tail_bytes -= len(tail.popleft())

    def total(self) -> int:
        """The usage chunk's ``total_tokens`` when the stream had one, else one per event."""
        found = _TOTAL_TOKENS.findall(self._last_bytes())
        return int(found[-1]) if found else self._events

    def output_tokens(self) -> int:
        """The usage chunk's ``completion_tokens`` when the stream had one, else one per
        event (which counts an engine's role-only first event and last event too)."""
        found = _COMPLETION_TOKENS.findall(self._last_bytes())
        return int(found[-1]) if found else self._events

    def _last_bytes(self) -> bytes:
        return b"".join(self._tail)[-STREAM_TAIL_BYTES:]
