"""A body's announced length against a listener's limit: only a number over it counts."""

from __future__ import annotations

import pytest

from app.listeners.limits import announces_more_than


@pytest.mark.parametrize(
    ("content_length", "over"),
    [
        (b"1024", False),
        (b"1025", True),
        (b"0", False),
        (b"0001025", True),
        (b" 1025 ", True),
        (b"9" * 5000, True),  # more digits than int() reads: over any limit
        (b"ten", False),  # the parser's to refuse
        (b"", False),
    ],
)
def test_a_length_is_over_the_limit_only_when_it_says_a_number_over_it(
    content_length: bytes, over: bool
) -> None:
    assert announces_more_than(content_length, 1024) is over
