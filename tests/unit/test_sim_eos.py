"""The simulated model's end-of-sequence token, and ``ignore_eos`` that overrides it."""

from __future__ import annotations

import msgspec

from agent.simulator.generation import parse_completion
from agent.simulator.responses import renderer_for


def completion(max_tokens: int, *, ignore_eos: bool = False) -> bytes:
    return msgspec.json.encode(
        {"model": "m", "prompt": "a b c", "max_tokens": max_tokens, "ignore_eos": ignore_eos}
    )


def test_without_ignore_eos_the_answer_stops_at_the_eos_token() -> None:
    generation = parse_completion(completion(32), "m").ending_at_eos(5)

    assert (generation.max_tokens, generation.finish_reason) == (5, "stop")
    body = msgspec.json.decode(renderer_for(generation, "m").body(5))
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 5


def test_ignore_eos_runs_the_answer_to_max_tokens() -> None:
    generation = parse_completion(completion(32, ignore_eos=True), "m").ending_at_eos(5)

    assert (generation.max_tokens, generation.finish_reason) == (32, "length")


def test_an_answer_shorter_than_the_eos_point_ends_on_its_length() -> None:
    generation = parse_completion(completion(4), "m")

    assert generation.ending_at_eos(5) == generation
    assert generation.ending_at_eos(None) == generation
