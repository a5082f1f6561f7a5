"""A request's routing key: what the ``prefix`` and ``session`` policies hash to a replica.

Prefix key (``prefix``, and ``session`` for a request without a session key): for a chat,
the leading messages up to and including the first user turn (at most
``MAX_KEY_MESSAGES``), each the first ``prefix_bytes`` bytes of its role and of its content
as the request's JSON spells them; for a completion, the first ``prefix_bytes`` bytes of the
prompt. Every turn of a conversation starts with the same system prompt and first user
turn, so every turn has the same key; two conversations that share a system prompt but not
a first question have different keys, and spread over the replicas (each of which soon
caches the shared system prompt). The work is bounded: a fixed number of messages, a fixed
number of bytes each, one BLAKE2b, and one more lenient msgspec scan of the body, which
skips the messages after those unbuilt; no tokenizer. The bytes are the JSON text,
escapes included: a client that spells the same text differently from turn to turn loses
the affinity, never the answer.

Session key (``session``): the first of the model's ``session_keys`` the request carries:
``header`` (``x-session-id``), or the body's ``prompt_cache_key`` or ``user`` (OpenAI's
fields; the engine reads them too). An empty or null field names no session, as an empty
header does: read as a key, it would make one session of every request that sends it.

A body the lenient reader here cannot read (``messages`` not an array, or one of its
leading messages not an object, say) has no key and is routed as by ``least_loaded``; the
engine judges the body, as before.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec

from app.domain.rendezvous import key_hash
from app.gateway.table import RoutePolicy

SESSION_HEADER = b"x-session-id"
MAX_KEY_MESSAGES = 4
"""Messages read for a prefix key at most: a system prompt or two, and the first turns
(the fields of ``_LeadingMessages``); the ones after them are not read."""
MAX_SESSION_KEY_BYTES = 1024
"""A longer session key is cut here before it is hashed."""

_ABSENT = msgspec.Raw(b"")
_NULL = b"null"
_USER = b'"user"'
_NO_SESSION = (b"", _NULL, b'""')
"""A body field that names no session: absent, null or an empty string."""

KeyKind = Literal["prefix", "session"]


class RouteKey(NamedTuple):
    kind: KeyKind
    value: int
    """The key's 64-bit hash, which the replicas' draws for it are made from."""


class _Message(msgspec.Struct, frozen=True):
    role: msgspec.Raw = _ABSENT
    content: msgspec.Raw = _ABSENT


_NO_MESSAGE = _Message()
"""A leading message the request does not have: this very object (``is``)."""


class _LeadingMessages(msgspec.Struct, array_like=True, frozen=True):
    """The first ``MAX_KEY_MESSAGES`` messages. Read as an array-like struct, whose
    elements past its fields msgspec skips unbuilt: a ``list`` would build a struct for
    every message of the body (the ten million empty ones of a 30 MiB body held the
    gateway's loop 1.7 s)."""

    first: _Message = _NO_MESSAGE
    second: _Message = _NO_MESSAGE
    third: _Message = _NO_MESSAGE
    fourth: _Message = _NO_MESSAGE


_NO_MESSAGES = _LeadingMessages()


class _KeyFields(msgspec.Struct):
    messages: _LeadingMessages = _NO_MESSAGES
    prompt: msgspec.Raw = _ABSENT
    user: msgspec.Raw = _ABSENT
    prompt_cache_key: msgspec.Raw = _ABSENT


_decode = msgspec.json.Decoder(_KeyFields).decode


def route_key(policy: RoutePolicy, body: bytes, session_header: bytes | None) -> RouteKey | None:
    """The key ``policy`` routes ``body`` by; ``None`` for ``least_loaded``, or when the
    request gives nothing to key on."""
    if policy.policy == "least_loaded":
        return None
    fields: _KeyFields | None = None
    if policy.policy == "session":
        for source in policy.session_keys:
            value: bytes | None
            if source == "header":
                value = session_header
            else:
                fields = fields or _read(body)
                raw = _head(
                    fields.prompt_cache_key if source == "prompt_cache_key" else fields.user,
                    MAX_SESSION_KEY_BYTES,
                )
                value = raw if raw not in _NO_SESSION else None
            if value:
                return RouteKey("session", key_hash(b"s\0" + value[:MAX_SESSION_KEY_BYTES]))
    prefix = prefix_bytes(fields or _read(body), policy.prefix_bytes)
    return RouteKey("prefix", key_hash(b"p\0" + prefix)) if prefix else None


def prefix_bytes(fields: _KeyFields, limit: int) -> bytes:
    """The bytes a prefix key hashes (empty: none)."""
    messages = fields.messages
    if messages.first is not _NO_MESSAGE:
        parts: list[bytes] = []
        for message in (messages.first, messages.second, messages.third, messages.fourth):
            if message is _NO_MESSAGE:
                break
            role = _head(message.role, limit)
            parts.append(role)
            parts.append(_head(message.content, limit))
            if role == _USER:
                break
        return b"\0".join(parts)
    prompt = _head(fields.prompt, limit)
    return prompt if prompt != _NULL else b""


def _head(raw: msgspec.Raw, limit: int) -> bytes:
    """The first ``limit`` bytes of ``raw``, copying no more than those."""
    if len(raw) <= limit:  # nearly always (a role, a session key): the quicker copy
        return bytes(raw)
    with memoryview(raw) as view:
        return view[:limit].tobytes()


def _read(body: bytes) -> _KeyFields:
    try:
        return _decode(body)
    except (msgspec.MsgspecError, RecursionError):
        return _KeyFields()
