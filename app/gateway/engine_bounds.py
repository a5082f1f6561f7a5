"""What the gateway takes of an engine's answer, in bytes and in time: the bounds the
engine client (``app.gateway.engine_client``) holds every answer to.

What an engine sends is read as hostile input, since it may be buggy, compromised, or
some other program on its port (docs/gateway.md, "What an engine may send"): an answer's
head (status line and headers, interim answers included) is at most ``MAX_HEAD_BYTES``; an
answer read whole is at most ``MAX_ANSWER_BYTES``, an error answer (a status of 400 and up)
at most ``MAX_ERROR_BYTES``.

Time is bounded too (``EngineTimeouts``), as nginx's ``proxy_read_timeout`` and Envoy's
idle timeouts do: the answer's head, and the first piece of its body, must come within
``head_s`` of the request (of its body's end, for an upload, whose body the engine may
leave unread for at most ``idle_s``); then the engine may be silent for at most ``idle_s``
between pieces. The gateway not reading (its client is slow) does not count as the
engine's silence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 << 10
"""An answer's head, interim answers before it included: as much as the gateway's listener
takes of a client's request head. Engines send a few hundred bytes."""
MAX_ANSWER_BYTES = 256 << 20
"""An answer read whole (not streamed), which the gateway holds in memory before sending it
on. Eight times the largest request body it takes (32 MiB), and far over what engines
answer: a batch of 2,048 embeddings of 3,072 dimensions in JSON is about 130 MB. A stream
is not bounded: it passes through at the client's pace, never held whole."""
MAX_ERROR_BYTES = 1 << 20
"""An error answer (a status of 400 and up), read whole to be put in OpenAI's shape: engines
send a few hundred bytes, and only the first 2,000 characters of its message are kept."""

DEFAULT_HEAD_TIMEOUT_S = 600.0
"""An answer's head (and a stream's first piece) within this of the request: a request
that is not streamed is answered only once it is generated whole, after however long it
waited in the engine's queue. The ``openai`` SDK waits as long by default before it gives
up, so an answer it would still take is never cut off."""
DEFAULT_IDLE_TIMEOUT_S = 120.0
"""Silence between pieces of an answer once they have begun: an engine generating sends a
piece every few tens of milliseconds; one that preempts a request to make room for others
(vLLM, when its KV cache runs short) may pause it for seconds to a minute."""
MAX_TIMEOUT_S = 86400.0


@dataclass(frozen=True)
class EngineTimeouts:
    """How long an engine may take to answer, and be silent once it has begun."""

    head_s: float = DEFAULT_HEAD_TIMEOUT_S
    idle_s: float = DEFAULT_IDLE_TIMEOUT_S

    def problems(self) -> list[str]:
        """What is wrong with these bounds, as messages naming the commands' flags."""
        return [
            f"{flag} must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds, not {value:g}"
            for flag, value in (
                ("--engine-head-timeout", self.head_s),
                ("--engine-idle-timeout", self.idle_s),
            )
            if not 0 < value <= MAX_TIMEOUT_S
        ]


OnTimeout = Callable[[str], None]
"""Told of each bound an engine overran: ``"head"`` or ``"idle"``."""
