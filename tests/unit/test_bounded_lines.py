"""A streamed answer cut into lines, each record bounded: the line breaks event streams
allow, wherever the pieces of the answer fall, and a record without end refused."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.bounded_lines import BoundedLines, RecordTooLarge

STREAM = b'id: 1\r\ndata: {"a": 1}\r\n\r\n: keep-alive\rdata: \xc3\xa9\n\nlast'
LINES = ["id: 1", 'data: {"a": 1}', "", ": keep-alive", "data: é", "", "last"]


def lines_of(chunks: list[bytes], max_record_bytes: int = 1000) -> list[str]:
    splitter = BoundedLines(max_record_bytes)
    found = [line for chunk in chunks for line in splitter.feed(chunk)]
    return found + splitter.finish()


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=10))
def test_the_lines_are_the_same_wherever_the_answer_is_cut(cuts: list[int]) -> None:
    edges = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in pairwise(edges)]

    assert lines_of(chunks) == LINES


def test_a_line_without_end_is_refused_once_it_passes_the_bound() -> None:
    splitter = BoundedLines(10)
    assert splitter.feed(b"x" * 10) == []

    with pytest.raises(RecordTooLarge):
        splitter.feed(b"x")


def test_a_record_of_many_short_lines_is_refused_but_records_may_follow_without_end() -> None:
    splitter = BoundedLines(10)
    for _ in range(100):  # records of 8 bytes each: the stream itself is not bounded
        assert splitter.feed(b"data: 1\n\n") == ["data: 1", ""]

    with pytest.raises(RecordTooLarge):
        splitter.feed(b"data: 1\ndata: 2\n")
