"""The agent's state directory as the commands take it: the one named when no flag names it,
the lock that one agent process at a time holds on it, and how an error names it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import TextIO

from agent.config import default_state_dir
from agent.config_sources import filled_variable
from app.regular_file import not_a_directory, open_regular_to_append

LOCK_FILE = "agent.lock"
STATE_DIR_ENV = "LLMGW_AGENT_STATE_DIR"


class StateDirBusy(Exception):
    """Another agent process holds the state directory."""


def lock_state_dir(state_dir: Path) -> TextIO:
    """Hold ``<state_dir>/agent.lock`` until the returned file is closed: two agents on one
    state directory would both re-attach, watch and report the same engines."""
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = open_regular_to_append(state_dir / LOCK_FILE)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise StateDirBusy(
            f"another llmgw-agent (pid {holder}) is using the state directory {state_dir}"
        ) from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def unusable_state_dir(state_dir: Path, error: OSError) -> str:
    """Why the agent cannot keep its state in ``state_dir``, and where that is set."""
    where = f" ({error.filename})" if error.filename and Path(error.filename) != state_dir else ""
    remedy = "free space on it, or give another" if error.errno == errno.ENOSPC else "give one"
    # mkdir says only "File exists" of a file, a FIFO or a dangling link where the directory
    # was to be: say which.
    problem = (
        (not_a_directory(state_dir) if error.errno == errno.EEXIST else None)
        or error.strerror
        or str(error)
    )
    return (
        f"the state directory {state_dir} cannot be used{where}: {problem}; "
        f"{remedy} this agent's user can write (--state-dir, {STATE_DIR_ENV} or state_dir in "
        "the config file)"
    )


def state_dir_from_env() -> Path:
    """``$LLMGW_AGENT_STATE_DIR``, else the default; ``ConfigError`` if it is set empty."""
    configured = filled_variable(os.environ, STATE_DIR_ENV)
    return Path(configured).expanduser() if configured else default_state_dir(os.environ)


def no_directory_at(path: Path) -> str | None:
    """``no such directory`` or ``not a directory``; None for a directory."""
    if path.is_dir():
        return None
    return "not a directory" if path.exists() else "no such directory"


def named_state_dir(directory: Path, *, named_by_flag: bool) -> str:
    """How an error names the state directory: by its flag when it was given one."""
    return f"--state-dir {directory}" if named_by_flag else f"the state directory {directory}"
