"""Small files: written so that a reader sees the old content or the new, never half;
read with a bound, and only when they are regular files (a FIFO would block the
reader, a device or a huge file would exhaust it)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


class NotARegularFile(Exception):
    """The path names a FIFO, a directory, a device or a socket."""


class TooLarge(Exception):
    """The file holds more than the reader accepts."""


def read_bounded(path: Path, limit: int) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes.

    Raises ``FileNotFoundError`` (and other ``OSError``), ``NotARegularFile``,
    ``TooLarge`` or ``UnicodeDecodeError``."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer, so fstat can refuse it.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotARegularFile(str(path))
        content = file.read(limit + 1)
    if len(content) > limit:
        raise TooLarge(str(path))
    return content.decode("utf-8")


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
