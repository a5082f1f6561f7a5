"""A byte order mark before a body is skipped once, at the very start, however the body is
cut into pieces; nothing else of the body is touched."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from app.listeners.bom import UTF8_BOM, LeadingMark, without_mark

BODY = b'{"model": "m"}'


def fed(pieces: list[bytes]) -> bytes:
    mark = LeadingMark()
    return b"".join(
        mark.feed(piece, more=index < len(pieces) - 1) for index, piece in enumerate(pieces)
    )


def cut(body: bytes, at: list[int]) -> list[bytes]:
    bounds = [0, *sorted(a % (len(body) + 1) for a in at), len(body)]
    return [body[start:end] for start, end in pairwise(bounds)]


def test_a_whole_body_loses_its_mark_and_nothing_else() -> None:
    assert without_mark(UTF8_BOM + BODY) == BODY
    assert without_mark(BODY) is BODY
    assert without_mark(UTF8_BOM + UTF8_BOM + BODY) == UTF8_BOM + BODY
    assert without_mark(b" " + UTF8_BOM + BODY) == b" " + UTF8_BOM + BODY
    assert without_mark(UTF8_BOM) == b""


def test_a_mark_cut_into_pieces_is_held_back_until_it_is_whole() -> None:
    mark = LeadingMark()

    assert mark.feed(UTF8_BOM[:1], more=True) == b""
    assert mark.feed(UTF8_BOM[1:2], more=True) == b""
    assert mark.feed(UTF8_BOM[2:] + BODY[:3], more=True) == BODY[:3]
    assert mark.feed(UTF8_BOM + BODY[3:], more=False) == UTF8_BOM + BODY[3:]


def test_what_only_looked_like_a_mark_is_passed_on_whole() -> None:
    mark = LeadingMark()

    assert mark.feed(b"\xef", more=True) == b""
    assert mark.feed(b"\xbb", more=False) == b"\xef\xbb"


def test_empty_pieces_before_the_mark_change_nothing() -> None:
    assert fed([b"", b"", UTF8_BOM, b"", BODY]) == BODY


@given(st.binary(max_size=40), st.booleans(), st.lists(st.integers(min_value=0), max_size=6))
def test_any_cut_of_a_body_gives_the_body_less_one_leading_mark(
    rest: bytes, marked: bool, at: list[int]
) -> None:
    body = (UTF8_BOM if marked else b"") + rest

    assert fed(cut(body, at)) == without_mark(body)
