"""A server's ``/readyz`` as llmgw-cli reads it: whether it can serve, and whether it
leads."""

from __future__ import annotations

import httpx
import msgspec

from cli.client import AdminClient, decode

READYZ_PATH = "/readyz"


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    """``/readyz``'s answer: whether the server can serve, and its role."""

    ready: bool = False
    role: str | None = None
    """``leader``, ``standby`` or ``stopped``; None for a server without a control plane."""
    failing: list[str] = []


_readiness_decoder = msgspec.json.Decoder(Readiness)


def readiness(client: AdminClient) -> Readiness:
    """``/readyz``: whether the server can serve and whether it leads. A server that
    is not ready answers 503 with the same document, which is returned, not raised."""
    answer = client.exchange("GET", READYZ_PATH)
    if answer.status not in (200, 503):
        raise client.error_answer(httpx.Response(answer.status, content=answer.body))
    return decode(_readiness_decoder, answer.body, "readiness answer")
