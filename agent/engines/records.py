"""What the agent remembers about each engine it runs, on disk, across its own restarts.

One JSON file per shard in ``<state_dir>/shards/``, and for an engine being spawned a
``.launch`` file until that is written (``LaunchRecord``). A record names the engine process
by its pid *and* its start time (``/proc/<pid>/stat`` field 22, clock ticks since boot):
pids are reused, so a pid alone could point a restarted agent at somebody else's process.
Before a restarted agent adopts (or ``stop-engines`` signals) a recorded process, it also
checks that the process is the engine by more than that (``agent.engines.identity``): a
start time counts from boot, so after a reboot a record kept in the state directory can
name a program that happens to have the same pid and start time.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple, TypeVar
from urllib.parse import quote

import msgspec
import structlog

from app.regular_file import FileRefused, read_regular_file
from wire.engines import DEFAULT_ENGINE

log = structlog.get_logger(__name__)
T = TypeVar("T")
MAX_RECORD_BYTES = 4 * 2**20
"""The most of a record file read: a record is a few KiB, its command at most what a
command line may hold. Anything else in the records' folder (a FIFO, a device, a file
grown by mistake) is skipped unread, rather than stopping the agent at start-up."""


class ShardState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class ShardKey(NamedTuple):
    replica_id: str
    shard_index: int


class EngineLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """What an engine was started as: held by its ``LaunchRecord`` before the spawn and by
    its ``ShardRecord`` after."""

    replica_id: str
    shard_index: int
    model: str
    port: int
    gpus: tuple[int, ...]
    command: tuple[str, ...]
    log_path: str
    started_at: datetime
    engine: str = DEFAULT_ENGINE
    """The engine's profile name (``wire.engines``); records written before profiles
    existed read as the default engine, whose probes they were started with."""
    boot_id: str = ""
    """The kernel's boot id when the engine was started (``current_boot_id``): with the pid,
    start time and process group it names an engine whose command cleared its environment,
    launch token included (``agent.engines.identity``). Empty in records written before."""

    @property
    def key(self) -> ShardKey:
        return ShardKey(self.replica_id, self.shard_index)


class ShardRecord(EngineLaunch, frozen=True, kw_only=True):
    pid: int
    process_start_time: int
    state: ShardState
    launch_token: str = ""
    """The token the engine has in its environment (``LaunchRecord``): what finds its
    processes once its leader is gone and its pid and group id may be another's. Empty in
    records written before launch tokens existed."""


class LaunchRecord(EngineLaunch, frozen=True, kw_only=True):
    """An engine about to be spawned: saved before the spawn and removed once the engine's
    ``ShardRecord`` is saved. An agent killed in between leaves this alone behind, and
    the next one finds the engine by ``token``, which the engine has in its environment
    (``wire.engine_env.LAUNCH_TOKEN_VARIABLE``)."""

    token: str

    def spawned(self, pid: int, start_time: int, state: ShardState) -> ShardRecord:
        """The shard's record once its engine runs as ``pid`` (started at ``start_time``):
        every field of the launch, whichever it has, and the token as ``launch_token``."""
        launch = {
            field.name: getattr(self, field.name) for field in msgspec.structs.fields(EngineLaunch)
        }
        return ShardRecord(
            **launch,
            pid=pid,
            process_start_time=start_time,
            state=state,
            launch_token=self.token,
        )


def shard_file_stem(key: ShardKey) -> str:
    """``<replica_id>-<shard_index>``, with anything unsafe in a file name percent-escaped."""
    return f"{quote(key.replica_id, safe='')}-{key.shard_index}"


class RecordStore:
    """Shard records as files; every write is atomic (temp file, fsync, rename, fsync dir).

    ``unlink`` removes one file (``Path.unlink``): a test hands in one that fails as a
    read-only or failing disk does, which no directory made read-only does for root.
    """

    def __init__(self, state_dir: Path, *, unlink: Callable[[Path], None] = Path.unlink) -> None:
        self.directory = state_dir / "shards"
        self._unlink_file = unlink
        self._left: set[Path] = set()
        """Files a removal failed to remove (a disk remounted read-only, or failing): each
        later change of the store tries again, until one goes or is written anew."""

    def save(self, record: ShardRecord) -> None:
        self._write(self._path(record.key), msgspec.json.encode(record))

    def remove(self, key: ShardKey) -> None:
        """Forget the shard's record. A disk that refuses (read-only, failing) is logged,
        never raised: the shard's engine is stopped or gone either way, and what a record
        left behind can do is bounded (``_remove``)."""
        self._remove(self._path(key))

    def save_launch(self, launch: LaunchRecord) -> None:
        self._write(self._launch_path(launch.key), msgspec.json.encode(launch))

    def remove_launch(self, key: ShardKey) -> None:
        """Forget the launch record, as ``remove`` does a shard record."""
        self._remove(self._launch_path(key))

    def load_launches(self) -> list[LaunchRecord]:
        """Every readable launch record; one that does not decode is logged and left alone."""
        launches, unreadable = self._load("*.launch", LaunchRecord)
        for path, error in unreadable:
            log.warning("launch_record_unreadable", path=path, error=error)
        return launches

    def _write(self, path: Path, data: bytes) -> None:
        """Raises ``OSError`` naming ``path`` (a failed write or flush names no file), with
        the temporary file removed: a full disk would otherwise keep one for each write it
        refused."""
        self._remove_left()
        self._left.discard(path)  # what it held is stale; what it will hold is not
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # A record holds the engine's command and its launch token: the agent's only.
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(descriptor, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(path)
            self._sync_directory()
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise OSError(exc.errno, exc.strerror, str(path)) from exc

    def _remove(self, path: Path) -> None:
        """Remove ``path``; if the disk refuses, log it once and try again at each later
        change of the store. Left behind, a record cannot mislead the next agent: it
        re-attaches only the same process (pid and start time, ``is_same_process``), never
        one that reused the pid, and finds what is left of the engine by its launch token,
        which no other program has. At worst that agent reports the shard ``failed`` once
        more ("exited while the agent was away") and removes the record itself."""
        self._remove_left()
        if path in self._left:
            return  # tried again just now, and logged when it first failed
        try:
            self._unlink(path)
        except OSError as exc:
            self._left.add(path)
            log.warning(
                "shard_record_not_removed",
                path=str(path),
                errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                error=exc.strerror,
            )

    def _remove_left(self) -> None:
        """Try again to remove the files the disk refused to remove; quiet while it still
        refuses, as it was logged already."""
        for path in sorted(self._left):
            try:
                self._unlink(path)
            except OSError:
                continue
            self._left.discard(path)
            log.info("shard_record_removed_late", path=str(path))

    def _unlink(self, path: Path) -> None:
        try:
            self._unlink_file(path)
        except FileNotFoundError:
            return
        self._sync_directory()

    def remove_temporaries(self) -> list[Path]:
        """Remove the temporary files of writes an agent killed mid-write left behind (the
        record they were to replace is whole: see ``_write``); the files removed. Call only
        while holding the state directory, as no write can be under way then."""
        removed: list[Path] = []
        for path in sorted(self.directory.glob(".*.tmp")):
            try:
                self._unlink(path)
            except OSError as exc:
                log.warning("shard_record_temporary_not_removed", path=str(path), error=str(exc))
                continue
            removed.append(path)
        return removed

    def load_all(self) -> list[ShardRecord]:
        """Every readable record; a file that does not decode is logged and left alone."""
        records, unreadable = self._load("*.json", ShardRecord)
        for path, error in unreadable:
            log.warning("shard_record_unreadable", path=path, error=error)
        return records

    def _load(self, pattern: str, kind: type[T]) -> tuple[list[T], list[tuple[str, str]]]:
        """The files matching ``pattern`` decoded, and those that did not (path, why)."""
        found: list[T] = []
        unreadable: list[tuple[str, str]] = []
        for path in sorted(self.directory.glob(pattern)):
            try:
                content = read_regular_file(path, MAX_RECORD_BYTES)
                found.append(msgspec.json.decode(content, type=kind))
            except FileRefused as exc:
                unreadable.append((str(path), exc.reason))
            except msgspec.DecodeError as exc:
                unreadable.append((str(path), str(exc)))
        return found, unreadable

    def _path(self, key: ShardKey) -> Path:
        return self.directory / f"{shard_file_stem(key)}.json"

    def _launch_path(self, key: ShardKey) -> Path:
        return self.directory / f"{shard_file_stem(key)}.launch"

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ProcStat(NamedTuple):
    state: str
    start_time: int

    @property
    def exited(self) -> bool:
        """A zombie (``Z``) or dead (``X``) process has exited: only its parent's ``wait()``
        keeps it listed."""
        return self.state in ("Z", "X")


def parse_proc_stat(text: str) -> ProcStat:
    """State (field 3) and start time (field 22) from the text of ``/proc/<pid>/stat``.

    Field 2 is the command name in parentheses and may itself contain spaces and
    parentheses, so the fields are counted from its last closing parenthesis.
    """
    fields = text[text.rindex(")") + 1 :].split()
    return ProcStat(state=fields[0], start_time=int(fields[19]))


def read_proc_stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return parse_proc_stat(text)


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id() -> str:
    """The kernel's random id of this boot: a new one at every boot. Empty if unreadable."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def process_identity(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot, or None if there is none."""
    stat = read_proc_stat(pid)
    return None if stat is None else stat.start_time


def is_running(pid: int, start_time: int) -> bool:
    """True only while process ``pid`` started at ``start_time`` is alive: a pid reused by
    another program since has another start time, and a zombie has exited."""
    stat = read_proc_stat(pid)
    return stat is not None and not stat.exited and stat.start_time == start_time


def is_same_process(record: ShardRecord) -> bool:
    """True only while the recorded engine itself is alive: same pid and same start time."""
    return is_running(record.pid, record.process_start_time)
