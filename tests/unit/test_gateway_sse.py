"""A relayed stream goes to the client in whole events, however the engine's pieces cut it:
the half event an engine dying mid-way leaves is never sent (``app.gateway.sse``)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from app.gateway.sse import MAX_HELD_BYTES, WholeEvents

EVENT = b'data: {"choices": [{"delta": {"content": "a"}}]}'
BLANK_LINES = [
    first + second
    for first in (b"\n", b"\r\n", b"\r")
    for second in (b"\n", b"\r\n", b"\r")
    if not (first == b"\r" and second.startswith(b"\n"))  # that is one line end: "\r\n"
]


def stream_of(ends: list[bytes]) -> tuple[bytes, list[int]]:
    """Five events, each ended by a blank line of ``ends`` in turn, and where each ends."""
    stream = b""
    ended: list[int] = []
    for i in range(5):
        stream += EVENT + ends[i % len(ends)]
        ended.append(len(stream))
    return stream, ended


def cut_at(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({cut % (len(stream) + 1) for cut in cuts}), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


@given(
    ends=st.lists(st.sampled_from(BLANK_LINES), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
    broken_after=st.integers(min_value=0),
)
def test_what_goes_before_a_break_is_the_whole_events_that_came(
    ends: list[bytes], cuts: list[int], broken_after: int
) -> None:
    stream, ended = stream_of(ends)
    pieces = cut_at(stream, cuts)
    came = pieces[: broken_after % (len(pieces) + 1)]
    events = WholeEvents()
    sent = b"".join(events.cut(piece) for piece in came)
    events.drop()
    assert stream.startswith(sent)
    # Up to an event's end: a client that reads an error event next reads only whole ones.
    # (A blank line "\n" "\r\n" may be cut before its "\n": the "\r" ends it already.)
    assert len(sent) in (0, *ended) or (len(sent) + 1 in ended and stream[len(sent)] == 10)
    # And every event that came whole went.
    whole = [end for end in ended if end <= sum(map(len, came))]
    assert len(sent) >= (whole[-1] - 1 if whole else 0)


@given(
    ends=st.lists(st.sampled_from(BLANK_LINES), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
)
def test_a_stream_that_ends_goes_whole_and_unchanged(ends: list[bytes], cuts: list[int]) -> None:
    stream = stream_of(ends)[0] + b"data: [DONE]"  # its engine's last blank line left out
    pieces = cut_at(stream, cuts)
    events = WholeEvents()
    sent = [events.cut(piece) for piece in pieces[:-1]]
    sent.append(events.rest(pieces[-1] if pieces else b""))
    assert b"".join(sent) == stream


def test_whole_events_go_at_once_and_half_of_one_waits_for_its_end() -> None:
    events = WholeEvents()
    piece = EVENT + b"\n\n"
    assert events.cut(piece) is piece  # nothing copied
    assert events.cut(EVENT + b"\n\n" + EVENT[:10]) == EVENT + b"\n\n"
    assert events.cut(EVENT[10:] + b"\n") == b""
    assert events.cut(b"\n" + EVENT[:5]) == EVENT + b"\n\n"


def test_an_event_too_long_to_hold_goes_on_as_it_comes() -> None:
    events = WholeEvents()
    half = b"data: " + b"x" * MAX_HELD_BYTES
    assert events.cut(half[:100]) == b""
    assert events.cut(half[100:]) == half
    assert events.cut(b"y\n\n" + EVENT[:5]) == b"y\n\n"
