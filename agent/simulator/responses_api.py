"""Bodies and streamed events of the Responses API (``POST /v1/responses``).

A whole answer is a ``response`` object with one assistant message whose one
``output_text`` part is the generated text. A stream is the Responses API's named events
(``event: <type>`` then ``data: {json}``), each with its ``sequence_number``:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, one ``response.output_text.delta`` per token, then
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.completed`` with the usage. Unlike chat
streams it ends without ``data: [DONE]``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from agent.simulator.generation import Generation
from agent.simulator.tokens import output_piece, output_text

_encode = msgspec.json.Encoder().encode


class ResponsesRenderer:
    def __init__(self, generation: Generation, model: str) -> None:
        self._generation = generation
        self._model = model
        self._id = f"resp_{uuid.uuid4().hex}"
        self._item_id = f"msg_{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._sequence = 0

    # -- a whole answer ----------------------------------------------------------------------

    def body(self, output_tokens: int) -> bytes:
        return _encode(self._response("completed", output_tokens))

    # -- a stream ------------------------------------------------------------------------------

    def opening(self) -> bytes:
        return b"".join(
            (
                self._event("response.created", response=self._response("in_progress", None)),
                self._event("response.in_progress", response=self._response("in_progress", None)),
                self._event(
                    "response.output_item.added",
                    output_index=0,
                    item=self._message("in_progress", None),
                ),
                self._part_event("response.content_part.added", part=_text_part("")),
            )
        )

    def tokens(self, start: int, stop: int) -> bytes:
        return b"".join(
            self._part_event("response.output_text.delta", delta=output_piece(index), logprobs=[])
            for index in range(start, stop)
        )

    def closing(self, output_tokens: int) -> bytes:
        text = output_text(output_tokens)
        return b"".join(
            (
                self._part_event("response.output_text.done", text=text, logprobs=[]),
                self._part_event("response.content_part.done", part=_text_part(text)),
                self._event(
                    "response.output_item.done",
                    output_index=0,
                    item=self._message("completed", output_tokens),
                ),
                self._event(
                    "response.completed", response=self._response("completed", output_tokens)
                ),
            )
        )

    # -- shapes --------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(payload) + b"\n\n"

    def _part_event(self, kind: str, **fields: Any) -> bytes:
        """An event about the answer's one content part: of the one message, the first
        output."""
        return self._event(kind, item_id=self._item_id, output_index=0, content_index=0, **fields)

    def _message(self, status: str, output_tokens: int | None) -> dict[str, Any]:
        content = [] if output_tokens is None else [_text_part(output_text(output_tokens))]
        return {
            "id": self._item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _response(self, status: str, output_tokens: int | None) -> dict[str, Any]:
        generation = self._generation
        done = output_tokens is not None
        input_tokens = len(generation.prompt)
        usage = None
        if output_tokens is not None:
            usage = {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            }
        return {
            "id": self._id,
            "object": "response",
            "created_at": self._created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": generation.max_tokens,
            "model": self._model,
            "output": [self._message("completed", output_tokens)] if done else [],
            "parallel_tool_calls": True,
            "temperature": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "text": {"format": {"type": "text"}},
            "metadata": {},
            "usage": usage,
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}
