"""Model spec files: YAML or JSON, one spec or several (a list, or YAML documents separated
by ``---``). The API checks the specs; this only reads them, and refuses what JSON cannot
carry: YAML's ``.inf`` and ``.nan`` and JSON's ``Infinity`` and ``NaN`` would be sent as
null, which the API reads as "the default"."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


class SpecFileError(Exception):
    """The file cannot be read as model specs; the message names the file and the place."""


def read_specs(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
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
        for field, number_value in _floats(spec):
            if not math.isfinite(number_value):
                name = spec.get("name")
                which = f" (model {name})" if isinstance(name, str) and name else where
                raise SpecFileError(
                    f"{path}{which}: {field} must be a finite number, not {number_value}"
                )
    return specs


def _floats(spec: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """Every float in ``spec``, with its path (``autoscale.target``, ``args[2]``). A loop,
    not a recursion, and each container once: YAML anchors can nest a list in itself."""
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


def _parse(path: Path, text: str) -> list[Any]:
    if path.suffix.lower() == ".json":
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise SpecFileError(
                f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
            ) from exc
    try:
        return [document for document in yaml.safe_load_all(text) if document is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecFileError(f"{path} is not valid YAML{where}: {problem}") from exc
