"""The small files the dev cluster keeps in its state directory, read with a bound.

Secrets, the API key, recorded ports and PostgreSQL's ``postmaster.pid`` are each a line or
a few. Read whole as given, a FIFO put in place of one would hang ``llmgw-dev`` and a huge
file would flood it; ``app.regular_file`` refuses both, and ``read_state_file`` turns the
refusal into a ``DevError`` naming the file and what to do.
"""

from __future__ import annotations

from pathlib import Path

from app.regular_file import FileMissing, FileRefused, read_regular_text
from devcluster.errors import DevError

ONE_LINE_BYTES = 4096
"""A secret, an API key or a port number, with room to spare."""


def read_state_file(path: Path, max_bytes: int = ONE_LINE_BYTES) -> str | None:
    """The text of the state file at ``path``; None when there is none. Anything but a
    regular UTF-8 file of at most ``max_bytes`` is a ``DevError`` naming it."""
    try:
        return read_regular_text(path, max_bytes)
    except FileMissing:
        return None
    except FileRefused as exc:
        raise DevError(f"cannot read {exc.path}: {exc.reason}; remove it and start again") from exc
