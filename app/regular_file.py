"""Reading a file an operator names: only a regular file, only up to a bound, never waited on.

A path read whole as given can be a FIFO (opening it waits for a writer for ever), a
device such as /dev/zero (read until memory runs out), a directory, or a file grown far
past what it should hold. ``read_regular_file`` refuses each of these with a reason that
names the file, so every program can turn it into its own clear error.

A few small files may instead be given as a pipe (``--runtime-password-file <(pass show
llmgw)``). ``read_file_or_pipe`` reads those as a stream, bounded in size and in time: a
named pipe no program writes to is refused at once rather than waited on, and a writer that
has not finished within ``PIPE_WAIT_SECONDS`` is given up on.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from pathlib import Path
from typing import TextIO

PIPE_WAIT_SECONDS = 60.0
"""How long ``read_file_or_pipe`` waits on a pipe's writer: long enough to type a passphrase
that ``pass`` or ``gpg`` asks for, short enough that a forgotten writer ends in an error."""

_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


class FileRefused(Exception):
    """The file could not be read, or is not one that may be read: ``reason`` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class FileMissing(FileRefused):
    """There is no file at the path."""

    def __init__(self, path: Path, reason: str = "no such file") -> None:
        super().__init__(path, reason)


def read_regular_file(path: Path, max_bytes: int, *, holder: str = "it") -> bytes:
    """The bytes of the regular file at ``path``, refused (``FileRefused``) when it is not
    a regular file or holds more than ``max_bytes``; at most one byte past the bound is read
    should the file grow meanwhile. ``holder`` names what may hold that much in the
    refusal ("over the 512 KiB a certificate file may hold")."""
    try:
        # Checked before opening (opening a FIFO waits for a writer) and again on what was
        # opened, without waiting, in case the path changed between.
        _check_regular(path, os.stat(path), max_bytes, holder)
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            _check_regular(path, os.fstat(file.fileno()), max_bytes, holder)
            data = file.read(max_bytes + 1)
    except FileNotFoundError as exc:
        raise FileMissing(path) from exc
    except OSError as exc:
        raise FileRefused(path, exc.strerror or str(exc)) from exc
    if len(data) > max_bytes:
        raise _too_large(path, f"more than {max_bytes:,} bytes", max_bytes, holder)
    return data


def check_regular_file(path: Path, max_bytes: int) -> None:
    """Refuse (``FileRefused``) what ``read_regular_file`` would, without reading: for a file
    another library opens by name, such as ``ssl`` a certificate, which would wait on a FIFO
    or read a device whole."""
    try:
        _check_regular(path, os.stat(path), max_bytes)
    except FileNotFoundError as exc:
        raise FileMissing(path) from exc
    except OSError as exc:
        raise FileRefused(path, exc.strerror or str(exc)) from exc


def read_regular_text(path: Path, max_bytes: int) -> str:
    """``read_regular_file`` decoded as UTF-8, refused naming the first bad byte if it is
    not."""
    data = read_regular_file(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(
            path, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from exc


def read_file_or_pipe(path: Path, max_bytes: int, *, wait: float = PIPE_WAIT_SECONDS) -> bytes:
    """At most ``max_bytes + 1`` bytes of what ``path`` holds, for a small file that a pipe or
    a device may stand in for: the caller refuses what is over ``max_bytes`` in its own
    words. Nothing is waited on for ever: opening does not wait for a writer, a named pipe
    that no program writes to (one made by ``mkfifo`` and left alone) is refused at once, and
    one whose writer has not finished within ``wait`` seconds is refused then. Refusals
    (``FileRefused``, ``FileMissing``) give the system's words, such as "Is a directory"."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise FileMissing(path, exc.strerror or "no such file") from exc
    except OSError as exc:
        raise FileRefused(path, exc.strerror or str(exc)) from exc
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(descriptor).st_mode)
        data = _read_within(path, descriptor, max_bytes + 1, time.monotonic() + wait, wait)
    finally:
        os.close(descriptor)
    if is_pipe and not data:
        # Read without waiting, a pipe no program has open for writing is at its end at
        # once: a writer that later comes would never be read, and a blocking open or read
        # would wait for it for ever.
        raise FileRefused(
            path,
            "a named pipe (FIFO) that no program writes to: give a file, or a pipe a "
            "command writes to such as <(command)",
        )
    return data


def _read_within(path: Path, descriptor: int, limit: int, deadline: float, wait: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        try:
            chunk = os.read(descriptor, limit - size)
        except BlockingIOError:
            left = deadline - time.monotonic()
            poller = select.poll()
            poller.register(descriptor, select.POLLIN)
            if left <= 0 or not poller.poll(left * 1000):
                raise FileRefused(path, f"its writer sent no end within {wait:g} seconds") from None
            continue
        except OSError as exc:
            raise FileRefused(path, exc.strerror or str(exc)) from exc
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def open_regular_to_append(path: Path) -> TextIO:
    """``path`` opened "a+" (created if missing), as a lock file is, refused with an
    ``OSError`` naming it when a FIFO, a device or a directory stands there: ``open`` alone
    says only "File or stream is not seekable" of a FIFO."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o666)
    try:
        kind = irregular_kind(os.fstat(descriptor).st_mode)
        if kind is not None:
            raise OSError(errno.EINVAL, f"not a regular file but {kind}", str(path))
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "a+", encoding="utf-8")
    except BaseException:
        os.close(descriptor)
        raise


def not_a_directory(path: Path) -> str | None:
    """What stands at ``path`` where a directory should be ("not a directory but a named pipe
    (FIFO)", "a symbolic link to ..., which does not exist"); None for a directory, or for
    nothing at all. ``mkdir`` says only "File exists" of each."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.islink(path):
            return None
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISDIR(mode):
        return None
    return f"not a directory but {irregular_kind(mode) or 'a regular file'}"


def irregular_kind(mode: int) -> str | None:
    """What a file of ``mode`` (its ``st_mode``) is, named for a refusal ("a named pipe
    (FIFO)"), when it is of a kind that is never read as a file; None for any other."""
    for is_kind, kind in _FILE_KINDS:
        if is_kind(mode):
            return kind
    return None


def _check_regular(path: Path, info: os.stat_result, max_bytes: int, holder: str = "it") -> None:
    kind = irregular_kind(info.st_mode)
    if kind is not None:
        raise FileRefused(path, f"not a regular file but {kind}")
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(path, "not a regular file")
    if info.st_size > max_bytes:
        raise _too_large(path, f"{info.st_size:,} bytes", max_bytes, holder)


def _too_large(path: Path, size: str, max_bytes: int, holder: str) -> FileRefused:
    return FileRefused(path, f"{size}, over the {_amount(max_bytes)} {holder} may hold")


def _amount(max_bytes: int) -> str:
    if max_bytes >= 2**20 and max_bytes % 2**20 == 0:
        return f"{max_bytes // 2**20} MiB"
    if max_bytes >= 1024 and max_bytes % 1024 == 0:
        return f"{max_bytes // 1024} KiB"
    return f"{max_bytes:,} bytes"
