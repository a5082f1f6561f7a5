"""Token accounting for tokens-per-minute: from a whole answer's usage, or from a stream."""

from __future__ import annotations

import pytest

from app.gateway.usage import MAX_FIGURE, STREAM_TAIL_BYTES, StreamTokens, usage_of_body


def test_a_whole_answer_reports_its_usage() -> None:
    body = b'{"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 9}}'
    assert usage_of_body(body) == 9


def test_an_answer_without_usage_or_json_reports_nothing() -> None:
    assert usage_of_body(b'{"id": "x"}') == 0
    assert usage_of_body(b'{"usage": null}') == 0
    assert usage_of_body(b'{"usage": {"type": "duration", "seconds": 3}}') == 0
    assert usage_of_body(b"not json") == 0


@pytest.mark.parametrize(
    "usage",
    [
        b'{"total_tokens": -1}',
        b'{"total_tokens": 1.5}',
        b'{"total_tokens": 9.0}',
        b'{"total_tokens": 1e3}',
        b'{"total_tokens": 1000000001}',
        b'{"total_tokens": 100000000000000000000000000000000}',
        b'{"total_tokens": "9"}',
        b'{"total_tokens": true}',
        b'{"prompt_tokens": -4, "total_tokens": 9}',
        b'{"completion_tokens": 0.5, "total_tokens": 9}',
        b'{"input_tokens": 4, "output_tokens": -5, "total_tokens": 9}',
        b"7",
        b"[]",
    ],
)
def test_usage_with_a_figure_that_is_no_count_is_unusable(usage: bytes) -> None:
    assert usage_of_body(b'{"id": "x", "usage": %s}' % usage) is None


def test_the_largest_figure_believed_is_a_billion() -> None:
    assert usage_of_body(b'{"usage": {"total_tokens": %d}}' % MAX_FIGURE) == MAX_FIGURE
    assert usage_of_body(b'{"usage": {"total_tokens": 0}}') == 0


def chunk(content: str) -> bytes:
    return b'data: {"choices": [{"delta": {"content": "%s"}}], "usage": null}\n\n' % (
        content.encode()
    )


def test_a_stream_with_a_usage_chunk_counts_what_it_says() -> None:
    tokens = StreamTokens()
    for word in ["a", "b", "c"]:
        tokens.feed(chunk(word))
    tokens.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, ')
    tokens.feed(b'"total_tokens": 8}}\n\ndata: [DONE]\n\n')
    assert tokens.total() == 8
    assert tokens.output_tokens() == 3


def test_a_responses_stream_counts_the_usage_of_its_completed_event() -> None:
    tokens = StreamTokens()
    for word in ["a", "b"]:
        tokens.feed(b'event: response.output_text.delta\ndata: {"delta": "%s"}\n\n' % word.encode())
    tokens.feed(
        b'event: response.completed\ndata: {"type": "response.completed", "response": {'
        b'"status": "completed", "usage": {"input_tokens": 5, "input_tokens_details": '
        b'{"cached_tokens": 0}, "output_tokens": 2, "output_tokens_details": '
        b'{"reasoning_tokens": 0}, "total_tokens": 7}}}\n\n'
    )
    assert tokens.total() == 7
    assert tokens.output_tokens() == 2


def test_a_stream_without_usage_counts_one_token_per_event() -> None:
    tokens = StreamTokens()
    for word in ["a", "b", "c", "d"]:
        tokens.feed(chunk(word))
    tokens.feed(b"data: [DONE]\n\n")
    assert tokens.total() == 4
    assert tokens.output_tokens() == 4


def test_a_long_stream_keeps_only_its_tail() -> None:
    tokens = StreamTokens()
    for _ in range(1000):
        tokens.feed(chunk("word"))
    tokens.feed(b'data: {"choices": [], "usage": {"total_tokens": 1234}}\n\ndata: [DONE]\n\n')
    assert tokens.total() == 1234
    big = StreamTokens()
    big.feed(chunk("x" * STREAM_TAIL_BYTES * 2))
    assert big.total() == 1


@pytest.mark.parametrize(
    "figure", [b"-8", b"8.5", b"8e0", b"1000000001", b"9" * 400, b"00000000008000"]
)
def test_a_streams_unusable_figure_counts_one_token_per_event(figure: bytes) -> None:
    tokens = StreamTokens()
    for word in ["a", "b"]:
        tokens.feed(chunk(word))
    tokens.feed(
        b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": %s, '
        b'"total_tokens": %s}}\n\ndata: [DONE]\n\n' % (figure, figure)
    )
    assert (tokens.total(), tokens.output_tokens(), tokens.unusable) == (3, 3, True)


def pieces(stream: bytes, sizes: list[int]) -> list[bytes]:
    """``stream`` cut as a network may deliver it: pieces of ``sizes`` bytes, in turn."""
    cut: list[bytes] = []
    at = 0
    while at < len(stream):
        size = sizes[len(cut) % len(sizes)]
        cut.append(stream[at : at + size])
        at += size
    return cut


@pytest.mark.parametrize(
    "sizes", [[1], [3], [5, 2], [6], [7, 1], [50]], ids=lambda sizes: "-".join(map(str, sizes))
)
@pytest.mark.parametrize("space", [b" ", b""], ids=["data: {", "data:{"])
def test_events_are_counted_however_the_stream_is_cut(sizes: list[int], space: bytes) -> None:
    stream = b"".join(chunk(word) for word in ["a", "bb", "ccc", "dddd"]) + b"data: [DONE]\n\n"
    tokens = StreamTokens()
    for piece in pieces(stream.replace(b"data: ", b"data:" + space), sizes):
        tokens.feed(piece)
    assert tokens.total() == 4  # was 0 a byte at a time, and for every data:{ stream
    assert tokens.output_tokens() == 4


@pytest.mark.parametrize("piece", [64, 1000, 1 << 20], ids=["small-pieces", "pieces", "whole"])
def test_a_completed_events_usage_counts_however_much_of_the_request_it_echoes_after(
    piece: int,
) -> None:
    # vLLM's response object ends with the client's ``user`` after its usage (and, when asked
    # for, every message in and out): the usage may be far from the stream's end.
    usage = (
        b'"usage": {"input_tokens": 90000, "input_tokens_details": {"cached_tokens": 0}, '
        b'"output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, '
        b'"total_tokens": 90002}'
    )
    completed = (
        b'event: response.completed\ndata: {"type": "response.completed", "response": {'
        b'"status": "completed", %s, "user": "%s"}}\n\n' % (usage, b"u" * 5 * STREAM_TAIL_BYTES)
    )
    stream = b"".join(
        b'event: response.output_text.delta\ndata: {"delta": "%s"}\n\n' % word
        for word in (b"a", b"b")
    )
    tokens = StreamTokens()
    for part in pieces(stream + completed, [piece]):
        tokens.feed(part)
    assert tokens.total() == 90002  # was 3: one per event
    assert tokens.output_tokens() == 2
