"""The last lines of an engine log, read from the end of the file."""

from __future__ import annotations

import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

BLOCK_BYTES = 8192
MAX_TAIL_BYTES = 256 * 1024


def last_lines(data: bytes, lines: int) -> list[str]:
    """The last ``lines`` lines of ``data``. Only ``\\n`` ends a line: progress bars redraw
    with ``\\r`` and would otherwise fill the tail with one bar's frames."""
    if lines <= 0:
        return []
    parts = data.decode("utf-8", errors="replace").split("\n")
    if parts[-1] == "":
        parts.pop()
    return [part.rstrip("\r") for part in parts[-lines:]]


def read_log_tail(path: Path, lines: int = 100, max_bytes: int = MAX_TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines of the file at ``path`` (none if it does not exist, or
    cannot be read: a failing disk, a stale mount. The tail goes with a shard's failure
    or stop, which must be reported all the same).

    Reads backwards block by block and never more than ``max_bytes``, so a huge log or a
    line without end costs the same as a small one; the oldest line may then be cut.
    """
    if lines <= 0:
        return []
    try:
        return last_lines(_read_end(path, lines, max_bytes), lines)
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("engine_log_unreadable", path=str(path), error=str(exc))
        return []


def _read_end(path: Path, lines: int, max_bytes: int) -> bytes:
    """The end of the file: enough blocks for ``lines`` lines, at most ``max_bytes``."""
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        start = end
        blocks: list[bytes] = []
        newlines = 0
        while start > 0 and newlines <= lines and end - start < max_bytes:
            size = min(BLOCK_BYTES, start, max_bytes - (end - start))
            start -= size
            file.seek(start)
            block = file.read(size)
            blocks.append(block)
            newlines += block.count(b"\n")
    return b"".join(reversed(blocks))
