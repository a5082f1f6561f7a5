"""The fake GPUs' health file and the declaration beside it, both hostile input.

The health file maps GPU indices to reasons, ``{"2": "XID 79: GPU has fallen off the
bus"}``. It can be written by hand, so it is read as what it may be: any size, not JSON,
a FIFO, entries naming GPUs the node lacks. ``read_health_file`` keeps the entries
``mark_fake_gpu`` would write and lists the others as problems; it never raises for
what the file holds, so a bad file costs only its own entries, never the node's GPUs.

The running agent writes how many fake GPUs it has to ``fake-gpus.json`` beside the
health file (``declare_fake_gpus``), with the MiB each has, so ``mark_fake_gpu`` can
refuse an index the node lacks and ``use_fake_gpu_memory`` more memory than its GPU has.
Without that file it knows only ``MAX_FAKE_GPUS``; the agent then ignores an unknown index,
with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.gpus.files import NotARegularFile, TooLarge, read_bounded, write_atomically
from agent.gpus.index_files import INDEX_KEY, read_index_file, rewrite_index_file, shown_key
from wire.messages import MAX_GPUS_PER_NODE

MAX_FAKE_GPUS = MAX_GPUS_PER_NODE
"""A node may report no more (``agent.gpu_limit``), fake or not."""
MAX_REASON_CHARS = 500
MAX_HEALTH_FILE_BYTES = 64 * 1024
"""Room for every GPU with the longest reason; anything bigger is not the file we write."""
DECLARATION_FILE = "fake-gpus.json"


@dataclass(frozen=True, slots=True)
class HealthFile:
    """The usable overrides (GPU index -> reason) and why anything else was ignored."""

    overrides: dict[int, str]
    problems: tuple[str, ...] = ()


def reason_problem(reason: str) -> str | None:
    """Why ``reason`` cannot mark a GPU unhealthy, or None when it can."""
    if not reason.strip():
        return "the reason is empty"
    if len(reason) > MAX_REASON_CHARS:
        return f"the reason has {len(reason)} characters, at most {MAX_REASON_CHARS}"
    if not reason.isprintable():
        return "the reason holds control characters"
    return None


def read_health_file(path: Path) -> HealthFile:
    """The overrides in ``path``, keeping only well-formed entries. Missing file: none."""
    return HealthFile(*read_index_file(path, MAX_HEALTH_FILE_BYTES, "index: reason", _entry))


def mark_fake_gpu(health_file: Path, index: int, reason: str | None) -> tuple[str, ...]:
    """Mark fake GPU ``index`` unhealthy for ``reason``, or healthy again with None.

    Refuses (``ValueError``) to mark an index the node does not have, or for a reason
    that ``reason_problem`` refuses. Rewrites the file with its well-formed entries only, so
    it always recovers from a bad file; returns what it dropped. Marks made at once
    (several commands) are serialised by a lock beside the file: none is lost."""
    if reason is not None:
        if (problem := reason_problem(reason)) is not None:
            raise ValueError(f"--reason: {problem}")
        # Clearing is never refused: it is how a file naming a GPU the node lacks recovers.
        check_fake_gpu_index(health_file, index)
    with locked_beside(health_file):
        current = read_health_file(health_file)
        rewrite_index_file(health_file, current.overrides, index, reason)
    return current.problems


def declare_fake_gpus(health_file: Path, count: int | None, memory_mib: int | None = None) -> None:
    """Say beside ``health_file`` how many fake GPUs the node has, and the MiB each has
    (they share one size) when given; None: it has none, and an earlier declaration is
    removed."""
    declaration = health_file.with_name(DECLARATION_FILE)
    if count is None:
        with contextlib.suppress(FileNotFoundError):
            declaration.unlink()
        return
    document = {"count": count}
    if memory_mib is not None:
        document["memory_mib"] = memory_mib
    write_atomically(declaration, json.dumps(document) + "\n")


def declared_fake_gpus(health_file: Path) -> int | None:
    """How many fake GPUs the agent declared beside ``health_file``; None when unknown
    (no agent with fake GPUs ran there, or the declaration is not one we wrote)."""
    return _declared(health_file, "count", MAX_FAKE_GPUS)


def declared_fake_gpu_memory(health_file: Path) -> int | None:
    """The MiB each fake GPU declared beside ``health_file`` has; None when unknown (the
    declaration of an agent older than this field says only the count)."""
    return _declared(health_file, "memory_mib", 2**63 - 1)


def _declared(health_file: Path, key: str, most: int) -> int | None:
    try:
        document = json.loads(read_bounded(health_file.with_name(DECLARATION_FILE), 1024))
    except (OSError, TooLarge, NotARegularFile, ValueError, RecursionError):
        return None
    value = document.get(key) if isinstance(document, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most:
        return value
    return None


def unknown_gpu_problems(path: Path, overrides: dict[int, str], known: Sequence[int]) -> list[str]:
    """One line per override naming a GPU not in ``known``."""
    return [
        f"{path}: entry {shown_key(str(index))} ignored: this node has GPUs {index_span(known)}"
        for index in sorted(set(overrides) - set(known))
    ]


def check_fake_gpu_index(health_file: Path, index: int) -> None:
    count = declared_fake_gpus(health_file)
    if count is not None and not 0 <= index < count:
        raise ValueError(
            f"--gpu {index}: the agent has {count} fake GPU(s), indices {index_span(range(count))}"
        )
    if not 0 <= index < MAX_FAKE_GPUS:
        raise ValueError(f"--gpu {index}: a fake GPU index is 0 to {MAX_FAKE_GPUS - 1}")


def _entry(key: str, reason: object) -> tuple[int, str] | str:
    if INDEX_KEY.fullmatch(key) is None or int(key) >= MAX_FAKE_GPUS:
        return f"the key is not a GPU index 0 to {MAX_FAKE_GPUS - 1}"
    if not isinstance(reason, str):
        return "the reason is not a string"
    problem = reason_problem(reason)
    return (int(key), reason) if problem is None else problem


def index_span(indices: Sequence[int]) -> str:
    return f"{indices[0]} to {indices[-1]}" if indices else "none"


@contextlib.contextmanager
def locked_beside(health_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on a file beside ``health_file`` (created if missing)."""
    health_file.parent.mkdir(parents=True, exist_ok=True)
    lock_path = health_file.with_name(f".{health_file.name}.lock")
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)
