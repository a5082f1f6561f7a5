"""Each engine's log files: the current launch's, and a bounded number of earlier ones.

An engine writes its stdout and stderr straight to ``<replica>-<index>.log`` (it holds the
file itself, so the log keeps filling while the agent is away). Before each launch the
supervisor moves the log aside, ``.log`` to ``.log.1``, ``.log.1`` to ``.log.2`` and so on,
dropping the oldest: an engine that crashes and is started again and again (a crash loop)
leaves at most ``KEPT_ENGINE_LOGS`` earlier logs, the last crash's among them, however long
the loop runs. A process of an earlier launch still writing keeps writing to the renamed
file, never to the new one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

KEPT_ENGINE_LOGS = 3
"""Logs of earlier launches kept beside the current one (``.log.1`` is the latest)."""


def earlier_log(path: Path, launches_ago: int) -> Path:
    """The log of the launch ``launches_ago`` before the current one (1: the one before)."""
    return path.with_name(f"{path.name}.{launches_ago}")


def rotate_log(path: Path, keep: int = KEPT_ENGINE_LOGS) -> None:
    """Move ``path`` aside as the latest of ``keep`` earlier logs, dropping the oldest, so
    that the next launch starts a log of its own. A log that is missing (the first launch,
    or one already gone) is skipped; raises ``OSError`` if a rename fails."""
    if keep <= 0:
        path.unlink(missing_ok=True)
        return
    earlier_log(path, keep).unlink(missing_ok=True)
    for launches_ago in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            earlier_log(path, launches_ago).rename(earlier_log(path, launches_ago + 1))
    with contextlib.suppress(FileNotFoundError):
        path.rename(earlier_log(path, 1))
