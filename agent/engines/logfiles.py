"""Each engine's log files: the current launch's, and a bounded number of earlier ones.

An engine writes its stdout and stderr straight to ``<replica>-<index>.log`` (it holds the
file itself, so the log keeps filling while the agent is away). Before each launch the
supervisor moves the log aside, ``.log`` to ``.log.1``, ``.log.1`` to ``.log.2`` and so on,
dropping the oldest: an engine that crashes and is started again and again (a crash loop)
leaves at most ``KEPT_ENGINE_LOGS`` earlier logs, the last crash's among them, however long
the loop runs. A process of an earlier launch still writing keeps writing to the renamed
file, never to the new one.

Replica ids are never used again, so the logs of shards that ended would pile up for as
long as the agent runs (every rollout, scale-down and drain leaves some):
``forget_ended_logs`` keeps those of the ``KEPT_ENDED_SHARDS`` shards that ended last
(their logs written last), and deletes the others.

Every log is for the agent's user alone (``0600``): ``processes`` creates the current one
so, and ``restrict_logs`` makes an adopted engine's logs so, which an older agent wrote
readable by everyone and which are not created again while the engine runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

KEPT_ENGINE_LOGS = 3
"""Logs of earlier launches kept beside the current one (``.log.1`` is the latest)."""
KEPT_ENDED_SHARDS = 100
"""Shards not running whose logs are kept: the last written."""

_LOG_NAME = re.compile(r"(?P<stem>.+)\.log(?:\.[0-9]+)?")


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


def restrict_logs(path: Path, keep: int = KEPT_ENGINE_LOGS) -> list[Path]:
    """Make ``path`` and its ``keep`` earlier logs readable by the agent's user alone; the
    files changed. A missing file is skipped, and so is anything but a regular file (a
    link is not followed); one that cannot be changed is left as it is (the caller logs
    it), as the engine goes on running either way."""
    changed: list[Path] = []
    for log in (path, *(earlier_log(path, ago) for ago in range(1, keep + 1))):
        with contextlib.suppress(OSError):
            descriptor = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                status = os.fstat(descriptor)
                if stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) != 0o600:
                    os.fchmod(descriptor, 0o600)
                    changed.append(log)
            finally:
                os.close(descriptor)
    return changed


def forget_ended_logs(
    logs_dir: Path, live: Collection[str], keep: int = KEPT_ENDED_SHARDS
) -> list[Path]:
    """Delete the logs of the shards not in ``live`` (file stems, ``<replica>-<index>``),
    all but the ``keep`` whose logs were written last; the files deleted. A file that
    cannot be read or deleted is left (the next call tries again); other files are not
    touched."""
    written: dict[str, float] = {}
    files: dict[str, list[Path]] = {}
    with contextlib.suppress(OSError):
        for entry in logs_dir.iterdir():
            found = _LOG_NAME.fullmatch(entry.name)
            if found is None or found["stem"] in live:
                continue
            try:
                modified = entry.stat().st_mtime
            except OSError:
                continue
            stem = found["stem"]
            written[stem] = max(written.get(stem, modified), modified)
            files.setdefault(stem, []).append(entry)
    ended = sorted(written, key=lambda stem: written[stem], reverse=True)
    deleted: list[Path] = []
    for stem in ended[keep:]:
        for path in files[stem]:
            with contextlib.suppress(OSError):
                path.unlink()
                deleted.append(path)
    return deleted
