"""A change sent again with the client's ``Idempotency-Key``: recorded once, answered again.

A client that lost the answer to a change (a proxy timed out, the connection broke after
the request went out) sends it again with the same key. The events of a change sent with a
key get ids derived from the actor, the key and their place in the change
(``event_ids``), so the log, which stores an event id once, holds the key as long as it
holds the events: for ever. Before deciding, the change's first id is looked for in the
log; found, the change was carried out before, and is answered from what it recorded
(``AlreadyCarriedOut``) instead of decided again. The events carry the key and a digest of
the request (its method, path, query and body) in their meta: the same key with another
request, another body or another endpoint, is refused (``KeyReused``). Keys of different
actors never meet: the actor is part of every id.

A change that recorded nothing (it changed nothing, or was refused) leaves no trace of its
key: sent again, it is decided again, as it would be without a key.
"""

from __future__ import annotations

import hashlib
import re
import uuid

import msgspec

from app.domain.operation_results import InvalidOperation, OperationError

MAX_KEY_CHARS = 128
KEY_CHARACTERS = "[A-Za-z0-9._:+/=-]"
KEY_PATTERN = re.compile(rf"{KEY_CHARACTERS}{{1,{MAX_KEY_CHARS}}}")
"""A key as a client sends it: a UUID, a ULID, base64 or hex of some random bytes."""

_NAMESPACE = uuid.UUID("5b0c7a4e-1f0e-4a8b-9a57-6c0d1e2f3a4b")
"""The namespace of the ids derived from keys (``uuid.uuid5``); never to change, or a key
sent before the change would be carried out again."""


class IdempotencyKey(msgspec.Struct, frozen=True, kw_only=True):
    """The key a request came with, and what the request asked (``request_digest``)."""

    key: str
    request_digest: str


def key_problem(sent: str) -> str | None:
    """What is wrong with ``sent`` as an idempotency key; None when it is usable. Sent as
    the IETF draft's Structured Field string (``"..."``) or bare."""
    key = unquoted(sent)
    if KEY_PATTERN.fullmatch(key):
        return None
    return (
        f"must be 1 to {MAX_KEY_CHARS} characters of letters, digits and . _ : + / = - "
        f"(a UUID will do), optionally in double quotes; got {len(sent)} character(s)"
    )


def unquoted(sent: str) -> str:
    stripped = sent.strip(" \t")
    if len(stripped) >= 2 and stripped[0] == stripped[-1] == '"':
        return stripped[1:-1]
    return stripped


def request_digest(method: str, target: bytes, body: bytes) -> str:
    """What a request asks, as compared for a key sent again: its method, its target (path
    and query, as sent) and its body, byte for byte."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), target, body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def event_ids(actor: str, key: str, count: int) -> list[uuid.UUID]:
    """The ids of the first ``count`` events of the change ``actor`` sent with ``key``."""
    return [uuid.uuid5(_NAMESPACE, f"{len(actor)}:{actor}:{key}:{index}") for index in range(count)]


class KeyReused(OperationError):
    """The key was sent before with another request: the change is not carried out."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"the Idempotency-Key {key!r} was sent before with another request (another "
            "body, or to another endpoint): nothing was recorded; send each change with a "
            "key of its own"
        )


class KeyShownOnce(InvalidOperation):
    """The key creation was sent again: it was carried out, but its secret, shown once, is
    kept nowhere to be shown again."""

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"this key creation was carried out by the first request with its "
            f"Idempotency-Key: it created key {key_id}, whose secret was shown only in that "
            f"answer and is kept nowhere; if it was lost, revoke the key "
            f"(`llmgw-cli keys revoke {key_id}`) and create another"
        )
        self.key_id = key_id
