"""Engine processes: starting one in its own session, signalling its group, noticing its exit.

Two kinds of handle share one interface. ``ChildProcess`` is an engine this agent process
started; ``AdoptedProcess`` is one an earlier agent process started and this one found
alive on start-up. Each engine leads its own session, so its process group id is its pid
and a signal to the group reaches the workers it forked as well.

An engine is asked to stop with its stop signal followed by SIGCONT (``ask_to_stop``), as
systemd and Kubernetes ask: a process stopped by job control (SIGSTOP, SIGTSTP) keeps the
stop signal pending until it is continued, and would otherwise sit out the whole grace
until SIGKILL, which ends a stopped process too. A process that runs ignores SIGCONT.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import stat
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import structlog

from agent.engines.errors import EngineLaunchError
from agent.engines.records import ShardRecord, is_same_process

log = structlog.get_logger(__name__)

KILL_WAIT_S = 10.0
"""How long an engine's processes get to be gone after SIGKILL before a stop reports
that they survived it (the agent's supervisor and ``stop-engines`` alike)."""


class EngineProcess(Protocol):
    @property
    def pid(self) -> int: ...

    async def wait_exit(self) -> int | None:
        """Wait until the engine has exited; its exit code when it can be known."""
        ...

    def signal_group(self, signum: int) -> bool:
        """Signal the engine's process group if it is still ours; False if it is gone."""
        ...


def spawn_engine(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> int:
    """Start ``argv`` as the leader of a new session and return its pid.

    stdin is /dev/null; stdout and stderr are appended to ``log_path`` (which the
    supervisor has moved aside first, ``agent.engines.logfiles``). The engine holds the log
    file itself, so the log keeps filling while the agent is away. Raises
    ``EngineLaunchError`` if the log cannot be written, and ``OSError`` if the program
    cannot be started.
    """
    if not argv:
        raise EngineLaunchError("empty engine command")
    log_fd = _open_log(log_path, argv)
    try:
        return os.posix_spawnp(
            argv[0],
            list(argv),
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(log_fd)


def _open_log(log_path: Path, argv: Sequence[str]) -> int:
    """``log_path`` open for appending, with a line saying which launch follows. Raises
    ``EngineLaunchError`` naming the log if it cannot be written (a full disk, say): the
    failure is the log's, not the engine program's, and no engine is started."""
    log_fd: int | None = None
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        # The log names the engine's command and the engine may print its settings: for
        # the agent's user only, a log an older agent wrote for everyone included.
        if stat.S_ISREG(os.fstat(log_fd).st_mode):
            os.fchmod(log_fd, 0o600)
        started = datetime.now(UTC).isoformat(timespec="seconds")
        os.write(log_fd, f"--- llmgw-agent {started}: {shlex.join(argv)}\n".encode())
    except OSError as exc:
        if log_fd is not None:
            os.close(log_fd)
        named = OSError(exc.errno, exc.strerror, exc.filename or str(log_path))
        raise EngineLaunchError(f"cannot write the engine log: {named}") from exc
    return log_fd


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False if no such group exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.error("engine_group_not_ours", pgid=pgid, signal=signum)
        return False
    return True


def ask_to_stop(process: EngineProcess, stop_signal: int) -> bool:
    """Send the engine's process group ``stop_signal``, then SIGCONT so that a stopped
    engine acts on it now (see the module docstring); False if the engine is gone."""
    if not process.signal_group(stop_signal):
        return False
    process.signal_group(signal.SIGCONT)
    return True


def ask_group_to_stop(pgid: int, stop_signal: int) -> bool:
    """``ask_to_stop`` for process group ``pgid``; False if no such group exists."""
    if not signal_group(pgid, stop_signal):
        return False
    signal_group(pgid, signal.SIGCONT)
    return True


class ChildProcess:
    """An engine this agent process started: its exit is awaited, and reaping it gives the
    exit code (negative: killed by that signal)."""

    def __init__(self, pid: int, *, poll_interval_s: float = 0.5) -> None:
        self._pid = pid
        self._poll_interval_s = poll_interval_s
        self._reaped = False

    @property
    def pid(self) -> int:
        return self._pid

    async def wait_exit(self) -> int | None:
        await self._exited()
        # Until it is reaped the leader is a zombie whose pid (the group id) cannot be
        # reused, so this reaches only what the engine left behind, such as workers that
        # still hold GPU memory.
        signal_group(self._pid, signal.SIGKILL)
        return self._reap()

    def signal_group(self, signum: int) -> bool:
        # Once reaped, the pid may already belong to another process.
        return not self._reaped and signal_group(self._pid, signum)

    def _reap(self) -> int | None:
        """Collect the exit status of the child, which has exited already."""
        self._reaped = True
        try:
            _, status = os.waitpid(self._pid, 0)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status)

    def _has_exited(self) -> bool:
        """Whether the child has exited, leaving it unreaped."""
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self._pid, flags) is not None

    async def _exited(self) -> None:
        """Return when the child has exited, without reaping it."""
        try:
            pidfd = os.pidfd_open(self._pid)
        except OSError:  # no pidfd before Linux 5.3: poll instead
            while not self._has_exited():  # noqa: ASYNC110 (nothing to await but time)
                await asyncio.sleep(self._poll_interval_s)
            return
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_readable)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)


class AdoptedProcess:
    """An engine an earlier agent process started, found alive through its record.

    It is not a child of this process (it was re-parented when its agent exited), and
    ``wait()`` works only on one's own children: its exit is noticed by polling its
    identity, and its exit code is lost. Polling the identity rather than the pid also
    keeps a process that reused the pid from passing for the engine.
    """

    def __init__(self, record: ShardRecord, *, poll_interval_s: float = 0.5) -> None:
        self._record = record
        self._poll_interval_s = poll_interval_s

    @property
    def pid(self) -> int:
        return self._record.pid

    async def wait_exit(self) -> int | None:
        while is_same_process(self._record):  # noqa: ASYNC110 (see the class docstring)
            await asyncio.sleep(self._poll_interval_s)
        # Workers left in the group keep its id from being reused, so this reaches them;
        # with none left, a new group could only take the id if pids wrapped around
        # within one poll interval.
        signal_group(self._record.pid, signal.SIGKILL)
        return None

    def signal_group(self, signum: int) -> bool:
        return is_same_process(self._record) and signal_group(self._record.pid, signum)
