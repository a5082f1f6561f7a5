"""Events to JSON and back, with upcasting of old payloads.

A payload is stored with its ``type`` tag and the ``schema_version`` of the class that
wrote it. Reading a payload at the current version is one msgspec decode into the tagged
union; an older payload is first lifted version by version through ``UPCASTERS``, so the
log stays readable forever without rewriting it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from app.domain.envelope import Meta, Recorded
from app.domain.events import EVENT_TYPES, AnyEvent, event_type
from app.store.errors import UnreadableEvent

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(AnyEvent)


def _shard_failed_v1_to_v2(payload: Payload) -> Payload:
    """v1 kept the engine's log as one string under ``log``; v2 keeps a list of lines."""
    lifted = dict(payload)
    log = lifted.pop("log", "") or ""
    lifted["log_tail"] = log.splitlines()[-100:]
    return lifted


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("shard_failed", 1): _shard_failed_v1_to_v2,
}
"""``(type, version) -> function`` lifting a payload from ``version`` to ``version + 1``."""


_recorded_decoder = msgspec.json.Decoder(Recorded)

RECORDED_COLUMNS = (
    "position, type, schema_version, json_build_object('position', position, 'stream', stream, "
    "'version', version, 'event_id', event_id, 'recorded_at', recorded_at, 'meta', meta, "
    "'event', data)::text AS recorded"
)
"""Columns to select for ``decode_recorded``: PostgreSQL builds each envelope as one JSON
text and msgspec decodes it in one call (a replay reads a million of them)."""


def decode_recorded(position: int, type_name: str, schema_version: int, recorded: str) -> Recorded:
    cls = EVENT_TYPES.get(type_name)
    try:
        if cls is not None and schema_version == cls.schema_version:
            decoded: Recorded = _recorded_decoder.decode(recorded)
            return decoded
        envelope = msgspec.json.decode(recorded)
        event = envelope.pop("event")
        event.pop("type", None)
        envelope["event"] = decode_event(
            position, type_name, schema_version, _encoder.encode(event)
        )
        envelope["meta"] = msgspec.convert(envelope["meta"], Meta)
        return msgspec.convert(envelope, Recorded, from_attributes=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise UnreadableEvent(position, type_name, str(exc)) from exc


def current_version(type_name: str) -> int:
    cls = EVENT_TYPES.get(type_name)
    return cls.schema_version if cls is not None else 1


# PostgreSQL's jsonb cannot hold U+0000, and engine output (log tails) can contain it. An
# escaped NUL (preceded by an even number of backslashes) becomes U+FFFD instead.
_ESCAPED_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def encode_event(event: AnyEvent) -> tuple[str, int, bytes]:
    """``(type, schema_version, json)`` for storage."""
    data = _encoder.encode(event)
    if b"\\u0000" in data:
        data = _ESCAPED_NUL.sub(rb"\1\\ufffd", data)
    return event_type(event), type(event).schema_version, data


def storable(event: AnyEvent) -> AnyEvent:
    """The event exactly as it will read back from the log: NUL characters replaced, and
    negative zeros positive (jsonb's numbers have no sign of zero), so that the writer's
    fold and a replay of the log agree."""
    data = _encoder.encode(event)
    if b"\\u0000" not in data and b"-0.0" not in data:
        return event
    data = encode_event(event)[2]
    if b"-0.0" in data:
        data = _encoder.encode(_without_negative_zero(msgspec.json.decode(data)))
    stored: AnyEvent = _event_decoder.decode(data)
    return stored


def _without_negative_zero(value: Any) -> Any:
    if isinstance(value, float):
        return 0.0 if value == 0.0 else value
    if isinstance(value, list):
        return [_without_negative_zero(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_negative_zero(v) for k, v in value.items()}
    return value


def storable_meta(meta: Meta) -> Meta:
    """The envelope exactly as it will read back from the log: NUL characters replaced, as
    in a payload (the actor and the correlation id are text columns too)."""
    texts = {
        "actor": meta.actor,
        "correlation_id": meta.correlation_id,
        "causation_id": meta.causation_id,
    }
    replaced = {
        name: text.replace("\x00", "\ufffd")
        for name, text in texts.items()
        if text is not None and "\x00" in text
    }
    return msgspec.structs.replace(meta, **replaced) if replaced else meta


def encode_meta(meta: Meta) -> bytes:
    return _encoder.encode(meta)


def decode_event(position: int, type_name: str, schema_version: int, data: bytes | str) -> AnyEvent:
    try:
        if type_name not in EVENT_TYPES:
            raise UnreadableEvent(position, type_name, "unknown event type")
        if schema_version == EVENT_TYPES[type_name].schema_version:
            decoded: AnyEvent = _event_decoder.decode(data)
            return decoded
        payload: Payload = msgspec.json.decode(data)
        payload = upcast(type_name, schema_version, payload)
        payload["type"] = type_name
        event: AnyEvent = msgspec.convert(payload, AnyEvent)
        return event
    except msgspec.ValidationError as exc:
        raise UnreadableEvent(position, type_name, str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise UnreadableEvent(position, type_name, str(exc)) from exc


def upcast(type_name: str, schema_version: int, payload: Payload) -> Payload:
    target = current_version(type_name)
    version = schema_version
    while version < target:
        step = UPCASTERS.get((type_name, version))
        if step is None:
            raise UnreadableEvent(0, type_name, f"no upcaster from schema version {version}")
        payload = step(payload)
        version += 1
    return payload


def record_from_row(row: Sequence[Any]) -> Recorded:
    """A row selected with ``RECORDED_COLUMNS``, decoded."""
    return decode_recorded(row[0], row[1], row[2], row[3])
