"""The prompts bench sends.

By default every prompt is unique from its first byte: it opens with a random header (16
hexadecimal digits, never repeated within a run), then words drawn at random to the
target length. No two prompts share a first token, so no prefix cache can answer any
part of a prefill and the measurement describes the hardware. ``shared_prefix`` asks the
cache question on purpose: every prompt is the same fixed text, byte for byte.

Lengths count words separated by single spaces: the simulator's tokens exactly, and
about one token each for a real tokenizer, since the vocabulary is short common English
words (the hexadecimal header is a few tokens).
"""

from __future__ import annotations

import random

_WORDS = """
    time year people way day man thing woman life child world school state family
    student group country problem hand part place case week company system program
    question work government number night point home water room mother area money story
    fact month lot right study book eye job word business issue side kind head house
    service friend father power hour game line end member law car city community name
    president team minute idea kid body information back parent face others level office
    door health person art war history party result change morning reason research girl
    guy moment air teacher force education foot boy age policy music market sense nation
    plan college interest death experience effect use class control care field
    development role effort rate heart drug show leader light voice wife police mind price
    report decision son view relationship town road arm difference value building action
    model season society tax director position player record paper space ground form
    event official matter center couple site project activity star table need court oil
    situation cost industry figure street image phone data picture practice piece land
    product doctor wall patient worker news test movie north love support technology step
    baby computer type attention film tree source organization hair window evidence
    population site river blue green small large early young important few public bad
    same able old long great little own other new good high different next last
"""
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(_WORDS.split()))
HEADER_DIGITS = 16
SHARED_SEED = 20240229


class PromptSource:
    """Makes the prompts of one run; ``rng`` makes a run reproducible."""

    def __init__(
        self, input_tokens: int, *, shared_prefix: bool, rng: random.Random | None = None
    ) -> None:
        if input_tokens < 1:
            raise ValueError("input_tokens must be at least 1")
        self._input_tokens = input_tokens
        self._rng = rng or random.Random()
        self._headers: set[str] = set()
        self._shared = _words(random.Random(SHARED_SEED), input_tokens) if shared_prefix else None

    @property
    def shared_prefix(self) -> bool:
        return self._shared is not None

    def next_prompt(self) -> str:
        if self._shared is not None:
            return self._shared
        return " ".join((self._new_header(), _words(self._rng, self._input_tokens - 1))).rstrip()

    def _new_header(self) -> str:
        while True:
            header = f"{self._rng.getrandbits(4 * HEADER_DIGITS):0{HEADER_DIGITS}x}"
            if header not in self._headers:
                self._headers.add(header)
                return header


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(count))
