"""One ``llmgw-dev`` per state directory.

A second run on a directory that a running one uses would share its PostgreSQL, stand by
behind its server, write its engine-port block over the first run's and, when it ends,
stop that PostgreSQL under the first cluster. So each run holds ``dev.lock`` in the
state directory (``flock``, with its pid in the file for the refusal to name) from before
it checks its ports until it has stopped. The lock goes with the process however it
ends, and no child inherits it (Python opens files non-inheritable): the engines and
PostgreSQL that a killed run leaves behind do not keep the next run out.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from app.regular_file import not_a_directory, open_regular_to_append
from devcluster.errors import DevError, StateDirInUse

LOCK_FILE = "dev.lock"


@dataclass(eq=False)
class StateDirLock:
    file: TextIO

    def release(self) -> None:
        self.file.close()


def dangling_link_refusal(state_dir: Path) -> str | None:
    """Why ``state_dir``, as given, cannot be used when it or a directory above it is a
    symbolic link to nothing; None otherwise. Checked before the path is resolved: resolved,
    a dangling link is its target, which ``lock_state_dir`` would create, so a link the
    operator thought pointed at a state directory would get an empty one."""
    for path in (state_dir, *state_dir.parents):
        if path.is_symlink() and not path.exists():
            where = "" if path == state_dir else f" ({path})"
            return (
                f"the state directory {state_dir} cannot be used{where}: a symbolic link to "
                f"{os.readlink(path)}, which does not exist; give one you can write with "
                "--state-dir"
            )
    return None


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Hold ``state_dir`` for this run (creating it); ``StateDirInUse`` when another run
    holds it, ``DevError`` when it cannot be made or written."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        file = open_regular_to_append(state_dir / LOCK_FILE)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != state_dir else ""
        # mkdir says only "File exists" of a file or a FIFO in the directory's place.
        problem = (
            (not_a_directory(state_dir) if exc.errno == errno.EEXIST else None)
            or exc.strerror
            or str(exc)
        )
        raise DevError(
            f"the state directory {state_dir} cannot be used{where}: {problem}; "
            "give one you can write with --state-dir"
        ) from exc
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip()
        file.close()
        pid = f" (pid {holder})" if holder.isdigit() else ""
        raise StateDirInUse(
            f"another llmgw-dev{pid} runs on {state_dir}: stop it first, or give this one a "
            "--state-dir of its own"
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    return StateDirLock(file)
