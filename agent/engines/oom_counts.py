"""Reading the kernel's OOM kill counters of an engine's cgroup and of the machine.

``agent.engines.oom`` is pure: it parses the text of the counter files. This is the one
place those files are read (from ``/proc`` and ``/sys``), when an engine is spawned and
again when it dies of SIGKILL, so that the rest of the supervisor neither opens them nor
needs a machine that has them to be tested.
"""

from __future__ import annotations

from pathlib import Path

from agent.engines.oom import SYSTEM_COUNTERS, OomCounts, oom_counter_files, oom_kills

MAX_COUNTER_FILE_BYTES = 2**20
"""The most read of a /proc or /sys file the OOM counters are in: /proc/vmstat is a few
KiB, /proc/self/mounts some hundred KiB on a node with thousands of mounts."""


def read_oom_counts(pid: int) -> OomCounts:
    """The OOM kills counted now in the memory cgroup of process ``pid`` and on the whole
    machine: the one place the supervisor reads the kernel's counters
    (``agent.engines.oom``). Unreadable files count as unknown."""
    proc_cgroup = _read_small(Path(f"/proc/{pid}/cgroup")) or ""
    mounts = _read_small(Path("/proc/self/mounts")) or ""
    at_start = OomCounts(cgroup_file=None, cgroup=None, in_cgroup=None, on_machine=None)
    for counter_file, cgroup in oom_counter_files(proc_cgroup, mounts):
        text = _read_small(counter_file)
        in_cgroup = None if text is None else oom_kills(text)
        if in_cgroup is not None:
            at_start = OomCounts(counter_file, cgroup, in_cgroup, None)
            break
    system = _read_small(SYSTEM_COUNTERS)
    return at_start._replace(on_machine=None if system is None else oom_kills(system))


def read_oom_kills(counts: OomCounts) -> tuple[int | None, int | None]:
    """The OOM kills counted now in the cgroup ``counts`` names, and on the machine."""
    in_cgroup = None
    if counts.cgroup_file is not None:
        text = _read_small(counts.cgroup_file)
        in_cgroup = None if text is None else oom_kills(text)
    text = _read_small(SYSTEM_COUNTERS)
    return in_cgroup, None if text is None else oom_kills(text)


def _read_small(path: Path) -> str | None:
    """A file of /proc or /sys, None if it is absent or unreadable."""
    try:
        with path.open("rb") as file:
            return file.read(MAX_COUNTER_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
