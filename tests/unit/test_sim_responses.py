"""Response bodies and stream chunks in OpenAI's shapes."""

from __future__ import annotations

from typing import Any

import msgspec

from agent.simulator.generation import Generation
from agent.simulator.responses import DONE_EVENT, ChatRenderer, CompletionRenderer, Renderer
from agent.simulator.tokens import output_text


def generation(kind: str, *, include_usage: bool = False, max_tokens: int = 3) -> Generation:
    return Generation(
        kind="chat" if kind == "chat" else "completion",
        prompt=("a", "b"),
        max_tokens=max_tokens,
        stream=True,
        include_usage=include_usage,
    )


def stream(renderer: Renderer, max_tokens: int) -> tuple[list[dict[str, Any]], bytes]:
    raw = renderer.opening() + renderer.tokens(0, 1) + renderer.tokens(1, max_tokens)
    raw += renderer.closing(max_tokens)
    events = raw.split(b"\n\n")
    assert events[-1] == b""
    assert all(event.startswith(b"data: ") for event in events[:-1])
    chunks = [msgspec.json.decode(event[6:]) for event in events[:-2]]
    return chunks, events[-2] + b"\n\n"


def test_a_chat_completion_has_openai_fields() -> None:
    completion = msgspec.json.decode(ChatRenderer(generation("chat"), "m").body(3))

    assert completion["id"].startswith("chatcmpl-")
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "m"
    assert isinstance(completion["created"], int)
    assert completion["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": output_text(3)},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert completion["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_a_chat_stream_opens_with_the_role_and_closes_with_the_finish_reason() -> None:
    chunks, last = stream(ChatRenderer(generation("chat"), "m"), 3)

    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(delta.get("content", "") for delta in deltas) == output_text(3)
    assert deltas[-1] == {}
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-2:] == [None, "length"]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert all("usage" not in chunk for chunk in chunks)
    assert last == DONE_EVENT


def test_a_stream_asked_for_usage_ends_with_a_usage_chunk_without_choices() -> None:
    chunks, _ = stream(ChatRenderer(generation("chat", include_usage=True), "m"), 3)

    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_a_completion_stream_puts_the_finish_reason_on_the_last_token() -> None:
    chunks, last = stream(CompletionRenderer(generation("completion", include_usage=True), "m"), 3)

    texts = [chunk["choices"][0] for chunk in chunks[:-1]]
    assert "".join(choice["text"] for choice in texts) == output_text(3)
    assert [choice["finish_reason"] for choice in texts] == [None, None, "length"]
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert last == DONE_EVENT
