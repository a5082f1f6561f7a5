"""Telling an engine the kernel's OOM killer ended from one killed by hand: both die of
SIGKILL, and only the kernel's counters (recorded here as the files hold them) tell."""

from __future__ import annotations

from pathlib import Path

from agent.engines.oom import (
    CGROUP_OOM,
    SYSTEM_OOM,
    OomCounts,
    oom_counter_files,
    oom_kills,
    oom_verdict,
)

MEMORY_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
OOM_CONTROL_V1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
VMSTAT = "nr_free_pages 123\npgmajfault 9\noom_kill 7\nnr_unstable 0\n"
MOUNTS_V2 = (
    "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
)
MOUNTS_HYBRID = (
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
)
MOUNTS_SPACED = "cgroup2 /run/my\\040cgroups cgroup2 rw 0 0\n"


def test_the_counter_is_read_from_each_file_that_holds_it() -> None:
    assert oom_kills(MEMORY_EVENTS) == 2
    assert oom_kills(OOM_CONTROL_V1) == 5
    assert oom_kills(VMSTAT) == 7


def test_a_file_without_the_counter_or_with_garbage_says_nothing() -> None:
    assert oom_kills("") is None
    assert oom_kills("oom 3\noom_group_kill 1\n") is None
    assert oom_kills("oom_kill lots\n") is None


def test_cgroup_v2_names_the_engines_memory_events() -> None:
    found = oom_counter_files("0::/system.slice/llmgw-agent.service\n", MOUNTS_V2)

    assert found == [
        (
            Path("/sys/fs/cgroup/system.slice/llmgw-agent.service/memory.events"),
            "/system.slice/llmgw-agent.service",
        )
    ]


def test_cgroup_v1_names_the_memory_controllers_oom_control() -> None:
    proc_cgroup = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n"

    assert oom_counter_files(proc_cgroup, MOUNTS_HYBRID) == [
        (Path("/sys/fs/cgroup/memory/docker/abc/memory.oom_control"), "/docker/abc")
    ]


def test_a_hybrid_machine_names_v2_first_then_v1s_memory_controller() -> None:
    """This machine's layout: v2 mounted beside v1, with memory on v1 only; the reader takes
    the first file that exists and holds the counter."""
    mounts = MOUNTS_HYBRID + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    proc_cgroup = "4:memory:/agents/a1\n1:cpu:/\n0::/\n"

    assert oom_counter_files(proc_cgroup, mounts) == [
        (Path("/sys/fs/cgroup/unified/memory.events"), "/"),
        (Path("/sys/fs/cgroup/memory/agents/a1/memory.oom_control"), "/agents/a1"),
    ]


def test_a_mount_point_with_a_space_and_a_path_that_climbs_stay_below_the_mount() -> None:
    found = oom_counter_files("0::/../../etc\n", MOUNTS_SPACED)

    assert found == [(Path("/run/my cgroups/etc/memory.events"), "/../../etc")]


def test_no_cgroup_mounted_or_none_listed_names_no_file() -> None:
    assert oom_counter_files("0::/a\n", "proc /proc proc rw 0 0\n") == []
    assert oom_counter_files("", MOUNTS_V2) == []
    assert oom_counter_files("garbage without colons\n", MOUNTS_V2) == []


def counts(in_cgroup: int | None, on_machine: int | None) -> OomCounts:
    return OomCounts(
        cgroup_file=Path("/sys/fs/cgroup/engines/memory.events"),
        cgroup="/engines",
        in_cgroup=in_cgroup,
        on_machine=on_machine,
    )


def test_the_engines_cgroup_counting_a_kill_names_the_cgroup() -> None:
    assert oom_verdict(counts(2, 7), 3, 8) == CGROUP_OOM.format(cgroup="/engines")
    assert "its cgroup (/engines) ran out of memory" in CGROUP_OOM.format(cgroup="/engines")


def test_the_machine_counting_a_kill_is_told_as_likely_where_the_cgroup_cannot_tell() -> None:
    assert oom_verdict(counts(None, 7), None, 8) == SYSTEM_OOM
    assert oom_verdict(counts(2, 7), None, 8) == SYSTEM_OOM  # unreadable at its death
    assert SYSTEM_OOM == (
        "the kernel's OOM killer ended a process while this engine ran; "
        "it probably ran out of host memory"
    )


def test_a_kill_elsewhere_on_the_machine_is_not_the_engines_when_its_cgroup_counted_none() -> None:
    """A kill by hand of an engine that ran while the OOM killer ended another process,
    outside its cgroup: the cgroup counts the kills of its processes by any OOM killer."""
    assert oom_verdict(counts(2, 7), 2, 8) is None


def test_no_counter_rising_or_none_known_adds_nothing() -> None:
    """A kill by hand, or counters hidden from the agent: "killed by SIGKILL", no more."""
    assert oom_verdict(counts(2, 7), 2, 7) is None
    assert oom_verdict(counts(None, None), None, None) is None
    assert oom_verdict(counts(2, 7), None, 7) is None
