"""Prompts: unique from their first bytes by default, byte-identical with a shared prefix."""

from __future__ import annotations

import itertools
import random

import pytest

from cli.bench.prompts import HEADER_DIGITS, VOCABULARY, PromptSource


def test_default_prompts_differ_pairwise_within_their_first_bytes() -> None:
    source = PromptSource(64, shared_prefix=False)

    prompts = [source.next_prompt() for _ in range(2000)]

    heads = [prompt[:HEADER_DIGITS] for prompt in prompts]
    assert len(set(heads)) == len(heads)
    assert all(len(prompt.split(" ")) == 64 for prompt in prompts)
    assert all(word in VOCABULARY for prompt in prompts for word in prompt.split()[1:])


def test_default_prompts_share_no_first_token_with_each_other() -> None:
    source = PromptSource(8, shared_prefix=False)

    first_tokens = [source.next_prompt().split()[0] for _ in range(500)]

    assert all(a != b for a, b in itertools.combinations(first_tokens, 2))


def test_shared_prefix_prompts_are_byte_identical_across_runs() -> None:
    one = PromptSource(100, shared_prefix=True, rng=random.Random(1))
    other = PromptSource(100, shared_prefix=True, rng=random.Random(2))

    prompts = {one.next_prompt() for _ in range(50)} | {other.next_prompt() for _ in range(50)}

    assert len(prompts) == 1
    assert len(prompts.pop().split(" ")) == 100


def test_a_seed_makes_the_random_prompts_reproducible() -> None:
    def first_three(seed: int) -> list[str]:
        source = PromptSource(16, shared_prefix=False, rng=random.Random(seed))
        return [source.next_prompt() for _ in range(3)]

    assert first_three(7) == first_three(7)
    assert first_three(7) != first_three(8)


def test_a_one_token_prompt_is_the_header_alone() -> None:
    prompt = PromptSource(1, shared_prefix=False).next_prompt()

    assert len(prompt) == HEADER_DIGITS
    assert int(prompt, 16) >= 0


def test_a_prompt_needs_a_token() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PromptSource(0, shared_prefix=False)
