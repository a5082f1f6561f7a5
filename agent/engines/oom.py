"""Whether the kernel's OOM killer ended an engine, from the counters the kernel keeps.

A process the OOM killer ends dies of SIGKILL, as one killed by hand does: its exit alone
cannot tell them apart. The kernel counts its kills, though: per memory cgroup
(``oom_kill`` in cgroup v2's ``memory.events``, or in cgroup v1's ``memory.oom_control``)
and for the whole machine (``oom_kill`` in ``/proc/vmstat``). The supervisor reads them
when it spawns an engine and again when the engine dies of SIGKILL; a counter that rose
in between says the OOM killer was at work. The engine's cgroup's counter says it of the
engine's cgroup (the engine, or a process beside it there, which the cgroup's limit ended);
the machine's says only that some process was ended while the engine ran, so it is told
as likely, not as fact.

Pure: every function here reads text handed to it, so the tests use recorded files; the
supervisor reads the files (``agent.engines.oom_counts``). A file that is absent or
unreadable (another cgroup layout, a container that hides it) counts as unknown, and then
nothing more is said.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import NamedTuple

MEMORY_EVENTS = "memory.events"
"""cgroup v2's events of a cgroup's memory controller, ``oom_kill`` among them."""
OOM_CONTROL = "memory.oom_control"
"""cgroup v1's memory controller state, ``oom_kill`` among it (Linux 4.13 on)."""
SYSTEM_COUNTERS = Path("/proc/vmstat")
CGROUP_OOM = "the kernel's OOM killer ended it: its cgroup ({cgroup}) ran out of memory"
SYSTEM_OOM = (
    "the kernel's OOM killer ended a process while this engine ran; "
    "it probably ran out of host memory"
)


class OomCounts(NamedTuple):
    """The OOM kills counted when an engine started: in its cgroup (``cgroup_file`` holds
    the counter, ``cgroup`` names the cgroup) and on the whole machine. None: unknown."""

    cgroup_file: Path | None
    cgroup: str | None
    in_cgroup: int | None
    on_machine: int | None


def oom_kills(text: str) -> int | None:
    """The ``oom_kill`` counter of a ``memory.events``, ``memory.oom_control`` or
    ``/proc/vmstat`` text (``name value`` lines); None if it has none."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def oom_counter_files(proc_cgroup: str, mounts: str) -> list[tuple[Path, str]]:
    """The files that may count the OOM kills of a process's memory cgroup, each with the
    cgroup's path, from the text of ``/proc/<pid>/cgroup`` and of ``/proc/self/mounts``:
    cgroup v2's (the ``0::`` line, under the ``cgroup2`` mount) first, then v1's memory
    controller's. On a machine that mounts both (hybrid), memory is in one of them only:
    the first file that exists and holds the counter is the one."""
    v2_root, v1_root = _cgroup_roots(mounts)
    v2: list[tuple[Path, str]] = []
    v1: list[tuple[Path, str]] = []
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hierarchy == "0" and controllers == "" and v2_root is not None:
            v2.append((_under(v2_root, path) / MEMORY_EVENTS, path))
        elif "memory" in controllers.split(",") and v1_root is not None:
            v1.append((_under(v1_root, path) / OOM_CONTROL, path))
    return v2 + v1


def oom_verdict(at_start: OomCounts, in_cgroup: int | None, on_machine: int | None) -> str | None:
    """What to add to "killed by SIGKILL", given the counts at the engine's start and at
    its death: its cgroup's counter rose; or, only where that counter is unknown, the
    machine's did. None otherwise, as for a kill by hand.

    A cgroup's counter counts the kills of its processes by any OOM killer, the machine's
    included: one known that did not rise says the engine was not among them, however many
    other processes the machine's counter saw ended while the engine ran (days, maybe)."""
    if at_start.in_cgroup is not None and in_cgroup is not None:
        return CGROUP_OOM.format(cgroup=at_start.cgroup) if in_cgroup > at_start.in_cgroup else None
    if _rose(at_start.on_machine, on_machine):
        return SYSTEM_OOM
    return None


def _rose(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after > before


def _cgroup_roots(mounts: str) -> tuple[Path | None, Path | None]:
    """Where cgroup v2 is mounted, and where cgroup v1's memory controller is."""
    v2_root: Path | None = None
    v1_root: Path | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind, options = _unescaped(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup2" and v2_root is None:
            v2_root = Path(where)
        elif kind == "cgroup" and "memory" in options and v1_root is None:
            v1_root = Path(where)
    return v2_root, v1_root


def _under(root: Path, cgroup: str) -> Path:
    """``cgroup`` (absolute within its hierarchy) below ``root``, never above it."""
    parts = [part for part in PurePosixPath(cgroup).parts[1:] if part not in ("", ".", "..")]
    return root.joinpath(*parts)


def _unescaped(field: str) -> str:
    """A ``/proc/self/mounts`` field: space, tab, newline and backslash are octal escapes."""
    for escape, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n")):
        field = field.replace(escape, character)
    return field.replace("\\134", "\\")
