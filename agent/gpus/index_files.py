"""The fake GPUs' files of one value per GPU index (``{"2": ...}``), read as hostile input.

The health file (``fake_health``) and the memory file (``fake_memory``) may both be written
by hand, so they are read as what they may be: any size, not JSON, a FIFO, entries that are
not what the commands write. ``read_index_file`` keeps the entries its ``parse`` accepts
and lists the others as problems; it never raises for what the file holds, so a bad file
costs only its own entries. ``rewrite_index_file`` writes one entry changed, with the
well-formed entries only, so a file always recovers from a bad one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from agent.gpus.files import NotARegularFile, TooLarge, read_bounded, write_atomically

V = TypeVar("V")
INDEX_KEY = re.compile(r"[0-9]{1,3}")
"""An entry's key as the commands write it: a GPU index in decimal digits."""


def read_index_file(
    path: Path, max_bytes: int, holds: str, parse: Callable[[str, object], tuple[int, V] | str]
) -> tuple[dict[int, V], tuple[str, ...]]:
    """The entries of ``path`` that ``parse`` accepts (an entry's key and value to ``(GPU
    index, value)``, or why it is ignored), and why anything else was ignored (``holds``
    says what the file is meant to hold, as ``index: reason``). A missing file holds none."""
    try:
        text = read_bounded(path, max_bytes)
    except FileNotFoundError:
        return {}, ()
    except TooLarge:
        return {}, (f"{path} is over {max_bytes} bytes; ignored",)
    except NotARegularFile:
        return {}, (f"{path} is not a regular file; ignored",)
    except OSError as exc:
        return {}, (f"cannot read {path}: {exc.strerror or exc}; ignored",)
    except UnicodeDecodeError:
        return {}, (f"{path} is not UTF-8 text; ignored",)
    try:
        document = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return {}, (f"{path} is not JSON; ignored",)
    if not isinstance(document, dict):
        return {}, (f"{path} must hold an object of {holds}; ignored",)
    entries: dict[int, V] = {}
    problems: list[str] = []
    for key, value in document.items():
        parsed = parse(key, value)
        if isinstance(parsed, str):
            problems.append(f"{path}: entry {shown_key(key)} ignored: {parsed}")
        else:
            entries[parsed[0]] = parsed[1]
    return entries, tuple(problems)


def rewrite_index_file(path: Path, entries: Mapping[int, V], index: int, value: V | None) -> None:
    """Write ``entries`` to ``path`` with ``index`` set to ``value`` (None: removed)."""
    changed = dict(entries)
    if value is None:
        changed.pop(index, None)
    else:
        changed[index] = value
    document = {str(key): item for key, item in sorted(changed.items())}
    write_atomically(path, json.dumps(document, indent=2) + "\n")


def shown_key(key: str) -> str:
    """``key`` quoted for a log line, cut so a hostile file cannot flood the log."""
    return repr(key if len(key) <= 40 else f"{key[:40]}...")
