"""The simulator's tokenizer and its deterministic output.

A token is a whitespace-separated word of the prompt: ``"Hello,  big world"`` is three
tokens. A chat prompt is every message's text joined by single spaces. A completion
prompt given as token ids counts one token per id. The output is ``max_tokens`` filler
words taken in order from ``FILLER_WORDS``, so the same request always gets the same text.
"""

from __future__ import annotations

from collections.abc import Sequence

FILLER_WORDS: tuple[str, ...] = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "simulated",
    "engines",
    "hum",
    "along",
    "in",
    "batches",
)


def tokenize(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def tokenize_ids(ids: Sequence[int]) -> tuple[str, ...]:
    return tuple(str(token_id) for token_id in ids)


def output_piece(index: int) -> str:
    """The text of output token ``index`` as it is streamed: words after the first lead
    with a space, so the pieces concatenate to ``output_text``."""
    word = FILLER_WORDS[index % len(FILLER_WORDS)]
    return word if index == 0 else " " + word


def output_text(count: int) -> str:
    return "".join(output_piece(index) for index in range(count))
