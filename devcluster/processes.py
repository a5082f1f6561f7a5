"""Child processes: each in a session of its own, its output in a log file, stopped in order
or killed with its whole process group.

A child leads its own session (and so its own process group): a terminal's Ctrl-C reaches
only the program that started it, which stops the rest in the right order, and killing a
group leaves nothing of the child behind. With a ``death_signal`` the kernel also sends it
that signal when its parent dies, however it dies (``PR_SET_PDEATHSIG``).

Children see this process's environment without any ``LLMGW_*`` variable, plus what they
are given: everything a cluster's processes need is passed to them explicitly, so a shell
set up for another cluster (``LLMGW_ADMIN_URL``, ``LLMGW_AGENT_*``) never leaks into them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.engines.records import read_proc_stat

BIN = Path(sys.executable).parent
PR_SET_PDEATHSIG = 1
WAIT_AFTER_KILL_S = 10.0


def program(name: str) -> str:
    """The installed program ``name``: beside this Python first (the virtualenv's), else
    on ``PATH``."""
    beside_python = BIN / name
    return str(beside_python) if beside_python.exists() else (shutil.which(name) or name)


def child_environment(settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any llmgw setting, plus ``settings``."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return inherited | dict(settings or {})


@dataclass(eq=False)
class Child:
    """One process started here: its name, its process, where its output goes."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> bool:
        return self.process.poll() is not None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, signum: signal.Signals) -> None:
        """Signal the process itself (not its group), unless it is gone already."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL its whole process group and reap it (once reaped, its pid may be
        another process's: nothing is sent then)."""
        if self.process.poll() is None:
            kill_group(self.pid)
        self.process.wait(timeout=WAIT_AFTER_KILL_S)

    def terminate(self, within_s: float) -> int:
        """SIGTERM, as a supervisor stops it; SIGKILL for its group if it is still there
        ``within_s`` later. Its exit code (negative: the signal that ended it)."""
        self.send(signal.SIGTERM)
        return self.wait_or_kill(within_s)

    def wait_or_kill(self, within_s: float) -> int:
        """Its exit code once it exits; SIGKILL for its group ``within_s`` from now."""
        try:
            return self.process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            kill_group(self.pid)
            return self.process.wait(timeout=WAIT_AFTER_KILL_S)


def spawn(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    settings: Mapping[str, str] | None = None,
    append: bool = False,
    death_signal: signal.Signals | None = None,
) -> Child:
    """Start ``argv`` in a session of its own, stdin closed, stdout and stderr to
    ``log_path`` (appended to with ``append``). ``settings`` are added to its environment
    (secrets go there, never on a command line that ``ps`` shows)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab" if append else "wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_environment(settings),
            start_new_session=True,
            preexec_fn=None if death_signal is None else _die_with_parent(death_signal),
        )
    return Child(name, process, log_path)


def run(
    argv: Sequence[str], *, timeout_s: float, settings: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a one-shot command (``llmgw-cli cert``, ``llmgw-server migrate``, ``llmgw-agent
    stop-engines``) to its end; its output captured."""
    return subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=child_environment(settings),
    )


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads, if there still is one."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process: a zombie has exited already, as the agent judges
    its engines (``ProcStat.exited``)."""
    stat = read_proc_stat(pid)
    return stat is not None and not stat.exited


def _die_with_parent(signum: signal.Signals) -> Callable[[], None]:
    """Run in the child before exec: send it ``signum`` when its parent dies, however it
    dies."""
    parent_pid = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child

    def arrange() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return arrange
