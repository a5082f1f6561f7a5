"""Model spec files: YAML or JSON, one spec or several (a list, or YAML documents separated
by ``---``). The API checks the specs; this only reads them, and refuses what cannot be
sent as it is written, each in one line naming the file and the place:

- anything but a regular file (a FIFO or a device would be read for ever), and a file over
  ``MAX_FILE_BYTES``;
- a key given twice in one mapping (YAML and JSON readers keep the last one silently);
- nesting deeper than ``MAX_DEPTH`` levels, the most the admin API reads, and a value that
  holds itself (a YAML alias inside its own anchor);
- a spec over ``MAX_SPEC_JSON_BYTES`` as JSON, the most the admin API takes, counted
  before it is written out: YAML aliases share one value many times over, and a few lines
  of them ("billion laughs") stand for gigabytes of JSON;
- what JSON cannot carry: YAML's ``.inf`` and ``.nan`` and JSON's ``Infinity`` and ``NaN``
  (sent as null, which the API reads as "the default"), and keys that are not strings.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import yaml
from yaml.nodes import MappingNode, Node

from app.regular_file import irregular_kind

MAX_FILE_BYTES = 4 * 2**20
"""The largest spec file read: a fleet of a hundred specs is a few hundred KiB."""
MAX_DEPTH = 32
"""Levels of nesting a spec may have as JSON (``app.admin.bodies.MAX_BODY_DEPTH``)."""
MAX_SPEC_JSON_BYTES = 2**20
"""The largest spec sent, as JSON (``app.admin.bodies.MAX_BODY_BYTES``)."""
MAX_MERGED_KEYS = 100_000
"""Keys that YAML merge keys (``<<: *defaults``) may copy into mappings, in all."""

_MERGE = "tag:yaml.org,2002:merge"


class SpecFileError(Exception):
    """The file cannot be read as model specs; the message names the file and the place."""


def read_specs(path: Path) -> list[dict[str, Any]]:
    text = _read(path)
    documents = _parse(path, text)
    specs: list[Any] = []
    for document in documents:
        specs.extend(document if isinstance(document, list) else [document])
    if not specs:
        raise SpecFileError(f"{path} holds no model spec")
    for number, spec in enumerate(specs, start=1):
        where = f" (spec {number})" if len(specs) > 1 else ""
        if not isinstance(spec, dict) or not all(isinstance(key, str) for key in spec):
            raise SpecFileError(
                f"{path}{where}: a model spec is a mapping of fields (name, command, "
                f"replicas, ...), not {type(spec).__name__}"
            )
        name = spec.get("name")
        which = f" (model {name})" if isinstance(name, str) and name else where
        _check_sendable(spec, f"{path}{which}")
        for field, number_value in _floats(spec):
            if not math.isfinite(number_value):
                raise SpecFileError(
                    f"{path}{which}: {field} must be a finite number, not {number_value}"
                )
    return specs


def _read(path: Path) -> str:
    """The file's text: a regular file of at most ``MAX_FILE_BYTES``, never waited on."""
    try:
        # Checked before opening (opening a FIFO waits for a writer, a tape rewinds) and
        # again on what was opened, without waiting, in case the path changed between.
        _check_regular(path, os.stat(path))
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            _check_regular(path, os.fstat(file.fileno()))
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise _too_large(path, len(data), "at least ")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc


def _check_regular(path: Path, info: os.stat_result) -> None:
    kind = irregular_kind(info.st_mode)
    if kind is not None:
        raise SpecFileError(
            f"{path} is not a regular file but {kind}: write the specs to a file and give that"
        )
    if not stat.S_ISREG(info.st_mode):
        raise SpecFileError(f"{path} is not a regular file: give a YAML or JSON file")
    if info.st_size > MAX_FILE_BYTES:
        raise _too_large(path, info.st_size)


def _too_large(path: Path, size: int, at_least: str = "") -> SpecFileError:
    return SpecFileError(
        f"{path} is {at_least}{size:,} bytes, over the {MAX_FILE_BYTES // 2**20} MiB a spec "
        "file may hold"
    )


def _parse(path: Path, text: str) -> list[Any]:
    if path.suffix.lower() == ".json":
        return [_parse_json(path, text)]
    try:
        return [doc for doc in yaml.load_all(text, Loader=_SpecLoader) if doc is not None]
    except _Refused as exc:
        raise SpecFileError(f"{path}: {exc.message}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecFileError(f"{path} is not valid YAML{where}: {problem}") from exc


def _parse_json(path: Path, text: str) -> Any:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        mapping: dict[str, Any] = {}
        for key, value in pairs:
            if key in mapping:
                raise SpecFileError(
                    f"{path}: key {key!r} is given twice in one object; one would be ignored"
                )
            mapping[key] = value
        return mapping

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise SpecFileError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise SpecFileError(f"{path}: nests deeper than {MAX_DEPTH} levels") from exc


class _Refused(yaml.YAMLError):
    """What ``_SpecLoader`` will not read, in words that name the place."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping, nesting deeper than
    a list of specs can be sent (its composer recurses once a level: a file of ``[`` would
    exhaust Python's stack), and merge keys that copy more than ``MAX_MERGED_KEYS`` keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._merged = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            # One level more than a spec may have: a file may be a list of specs.
            if self._depth > MAX_DEPTH + 1:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise _Refused(f"nests deeper than {MAX_DEPTH} levels at line {line}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # The keys as written, before merge keys (<<) add theirs, which those written
        # override on purpose.
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:  # unhashable: PyYAML refuses it below, with its place
                continue
            if first is not None:
                raise _Refused(
                    f"key {key!r} is given twice in one mapping, at line {first} and line "
                    f"{line}; one would be ignored"
                )
            lines[key] = line
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node: MappingNode) -> None:
        written = sum(1 for key_node, _ in node.value if key_node.tag != _MERGE)
        super().flatten_mapping(node)
        # PyYAML copies each merged key once per mapping, so one mapping gets at most the
        # keys of the file; but thousands of mappings merging one big one would copy it
        # thousands of times.
        self._merged += len(node.value) - written
        if self._merged > MAX_MERGED_KEYS:
            raise _Refused(
                f"merge keys (<<) copy more than {MAX_MERGED_KEYS:,} keys into mappings "
                f"(at line {node.start_mark.line + 1})"
            )


def _check_sendable(spec: dict[str, Any], where: str) -> None:
    """``spec`` nests at most ``MAX_DEPTH`` levels, holds no value inside itself and no key
    that is not a string, and is at most ``MAX_SPEC_JSON_BYTES`` as JSON."""
    measure = _Measure(where)
    _, size = measure(spec, "", 1)
    if size > MAX_SPEC_JSON_BYTES:
        expanded = " (its YAML aliases written out)" if measure.shared else ""
        raise SpecFileError(
            f"{where}: is {size:,} bytes as JSON{expanded}, over the "
            f"{MAX_SPEC_JSON_BYTES // 2**20} MiB the admin API takes"
        )


_Container = dict[Any, Any] | list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any]


class _Measure:
    """The height (levels of nesting) and compact JSON size of a value, each container
    measured once however often it is shared (what YAML aliases make), never by writing
    it out; a ``SpecFileError`` as soon as it is found too deep, holding itself, or
    holding a key JSON cannot carry. It recurses no deeper than ``MAX_DEPTH``."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.shared = False
        self._measured: dict[int, tuple[int, int]] = {}
        self._within: set[int] = set()

    def __call__(self, value: Any, field: str, depth: int) -> tuple[int, int]:
        if not isinstance(value, dict | list | tuple | set | frozenset):
            return 0, _scalar_size(value, field, self.where)
        known = self._measured.get(id(value))
        if known is not None:
            self.shared = True
        elif id(value) in self._within:
            raise SpecFileError(
                f"{self.where}: {field or 'the spec'} holds itself (an alias inside its own "
                "anchor): JSON cannot carry it"
            )
        elif depth > MAX_DEPTH:
            raise self._too_deep(field)
        else:
            self._within.add(id(value))
            known = self._container(value, field, depth)
            self._within.discard(id(value))
            self._measured[id(value)] = known
        if depth - 1 + known[0] > MAX_DEPTH:
            raise self._too_deep(field)
        return known

    def _container(self, value: _Container, field: str, depth: int) -> tuple[int, int]:
        height, size = 0, 2 + max(len(value) - 1, 0)  # brackets, commas
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SpecFileError(
                        f"{self.where}: {field or 'the spec'} has the key {key!r}, not a "
                        "string: JSON keys are strings (quote it)"
                    )
                inner, inner_size = self(item, f"{field}.{key}".lstrip("."), depth + 1)
                height, size = max(height, inner), size + len(_json(key)) + 1 + inner_size
        else:
            for index, item in enumerate(value):
                inner, inner_size = self(item, f"{field}[{index}]", depth + 1)
                height, size = max(height, inner), size + inner_size
        return height + 1, size

    def _too_deep(self, field: str) -> SpecFileError:
        return SpecFileError(
            f"{self.where}: nests deeper than {MAX_DEPTH} levels, the most the admin API "
            f"reads (at {field})"
        )


def _scalar_size(value: Any, field: str, where: str) -> int:
    try:
        return len(_json(value))
    except (TypeError, OverflowError, msgspec.EncodeError) as exc:
        raise SpecFileError(f"{where}: {field} cannot be sent as JSON: {exc}") from exc


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


def _floats(spec: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """Every float in ``spec``, with its path (``autoscale.target``, ``args[2]``). A loop,
    not a recursion, and each container once: YAML anchors share values."""
    seen: set[int] = set()
    pending: list[tuple[str, Any]] = [("", spec)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, float):
            yield where, value
        elif isinstance(value, dict | list) and id(value) not in seen:
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in reversed(list(items)):
                inner = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}"
                pending.append((inner.lstrip("."), item))
