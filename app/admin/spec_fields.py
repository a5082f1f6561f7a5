"""The fields a spec's body may have at a place in it, to name the one meant when an
operator's file misspells a field (``rollout.max_failure``): refused alone, a typo sends the
operator to the documentation for a name the API knows."""

from __future__ import annotations

import difflib
import re

import msgspec.inspect

_ITEM = re.compile(r"\[\d+\]")


def fields_at(body: type, path: str) -> tuple[str, ...]:
    """The field names, as sent, of the object at ``path`` (``rollout.steps[0]``) in a body
    of type ``body``; none when the path leads to no object of known fields."""
    info: msgspec.inspect.Type = msgspec.inspect.type_info(body)
    for part in filter(None, path.split(".")):
        info = _object(info)
        if not isinstance(info, msgspec.inspect.StructType):
            return ()
        name = _ITEM.sub("", part)
        found = [f.type for f in info.fields if f.encode_name == name]
        if not found:
            return ()
        info = found[0]
        for _ in _ITEM.findall(part):
            listed = _object(info)
            if not isinstance(listed, msgspec.inspect.ListType | msgspec.inspect.VarTupleType):
                return ()
            info = listed.item_type
    info = _object(info)
    if not isinstance(info, msgspec.inspect.StructType):
        return ()
    return tuple(f.encode_name for f in info.fields)


def meant_field(body: type, path: str, unknown: str) -> str | None:
    """The field of the object at ``path`` that ``unknown`` most likely misspells."""
    close = difflib.get_close_matches(unknown, fields_at(body, path), n=1, cutoff=0.75)
    return close[0] if close else None


def _object(info: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """``info`` without the null an optional field allows."""
    if isinstance(info, msgspec.inspect.UnionType):
        others = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(others) == 1:
            return others[0]
    return info
