"""A disk that refuses to remove files, as one remounted read-only (EROFS) or failing
(EIO) does: what ``RecordStore`` is handed as its ``unlink`` in a test, since no directory
made read-only refuses a removal to root."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FailingDisk:
    failing: int | None = None
    """The errno each removal fails with (``errno.EROFS``, ``errno.EIO``); None: it works."""

    def unlink(self, path: Path) -> None:
        if self.failing is not None:
            raise OSError(self.failing, os.strerror(self.failing), str(path))
        path.unlink()

    def remounted_read_only(self) -> None:
        self.failing = errno.EROFS

    def failing_with_eio(self) -> None:
        self.failing = errno.EIO

    def repaired(self) -> None:
        self.failing = None
