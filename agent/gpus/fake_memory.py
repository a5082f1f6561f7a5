"""The fake GPUs' memory file: how much memory other processes use on each, hostile input.

``llmgw-agent fake-gpu use --gpu 0 --mib 30000`` writes ``{"0": 30000}`` to
``fake-gpu-memory.json`` beside the health file (``use_fake_gpu_memory``); the agent reads
it on every snapshot (``read_memory_file``), so a fake GPU's used memory changes while the
agent runs, as a real one's does when a process takes or frees memory. ``--mib 0`` frees
it. Like the health file it may be written by hand: ``read_memory_file`` keeps the entries
``use_fake_gpu_memory`` would write and lists the others as problems, never raising for
what the file holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.gpus.fake_health import check_fake_gpu_index, declared_fake_gpu_memory, locked_beside
from agent.gpus.index_files import INDEX_KEY, read_index_file, rewrite_index_file

MEMORY_FILE = "fake-gpu-memory.json"
MAX_FAKE_USED_MIB = 1024 * 1024
"""1 TiB: more than any GPU has (the control plane refuses a GPU claiming more)."""
MAX_MEMORY_FILE_BYTES = 16 * 1024
"""Room for every GPU's entry many times over; anything bigger is not the file we write."""


@dataclass(frozen=True, slots=True)
class MemoryFile:
    """The usable entries (GPU index -> MiB used) and why anything else was ignored."""

    used_mib: dict[int, int]
    problems: tuple[str, ...] = ()


def memory_file_beside(health_file: Path) -> Path:
    return health_file.with_name(MEMORY_FILE)


def read_memory_file(path: Path) -> MemoryFile:
    """The entries in ``path``, keeping only well-formed ones. Missing file: none."""
    return MemoryFile(*read_index_file(path, MAX_MEMORY_FILE_BYTES, "index: MiB", _entry))


def use_fake_gpu_memory(memory_file: Path, index: int, mib: int) -> tuple[str, ...]:
    """Say that other processes use ``mib`` MiB of fake GPU ``index`` (0: none).

    Refuses (``ValueError``) an index the node does not have, a size no GPU has, or more
    than the running agent declared its fake GPUs have.
    Rewrites the file with its well-formed entries only; returns what it dropped. Writes
    made at once are serialised by a lock beside the file: none is lost."""
    if not 0 <= mib <= MAX_FAKE_USED_MIB:
        raise ValueError(f"--mib {mib}: MiB used is 0 to {MAX_FAKE_USED_MIB}")
    if mib:
        # Freeing is never refused: it is how a file naming a GPU the node lacks recovers.
        check_fake_gpu_index(memory_file, index)
        # The agent would ignore such an entry (logged once), leaving the GPU unused.
        total = declared_fake_gpu_memory(memory_file)
        if total is not None and mib > total:
            raise ValueError(f"--mib {mib}: GPU {index} has {total} MiB")
    with locked_beside(memory_file):
        current = read_memory_file(memory_file)
        rewrite_index_file(memory_file, current.used_mib, index, mib or None)
    return current.problems


def _entry(key: str, mib: object) -> tuple[int, int] | str:
    if INDEX_KEY.fullmatch(key) is None:
        return "the key is not a GPU index"
    if isinstance(mib, bool) or not isinstance(mib, int):
        return "the MiB used is not a whole number"
    if not 0 <= mib <= MAX_FAKE_USED_MIB:
        return f"the MiB used is not 0 to {MAX_FAKE_USED_MIB}"
    return int(key), mib
