"""``read_file_or_pipe``: a small file that a pipe may stand in for is read within bounds
of size and time, and a named pipe nothing writes to is refused rather than waited on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.regular_file import FileMissing, FileRefused, read_file_or_pipe
from tests.support.waiting import open_fifo_writer_briefly, outcome_within


@pytest.fixture
def silent_pipe() -> Iterator[Path]:
    """A pipe whose writer is there and sends nothing."""
    read_end, write_end = os.pipe()
    yield Path(f"/dev/fd/{read_end}")
    os.close(read_end)
    os.close(write_end)


def test_a_file_is_read_up_to_one_byte_past_the_bound(tmp_path: Path) -> None:
    file = tmp_path / "secret"
    file.write_bytes(b"x" * 10)

    assert read_file_or_pipe(file, 4) == b"xxxxx"
    assert read_file_or_pipe(file, 10) == b"x" * 10


def test_a_device_is_read_only_up_to_one_byte_past_the_bound() -> None:
    assert read_file_or_pipe(Path("/dev/zero"), 4096) == b"\0" * 4097


def test_a_missing_file_and_a_directory_are_refused_in_the_systems_words(
    tmp_path: Path,
) -> None:
    with pytest.raises(FileMissing, match="No such file or directory"):
        read_file_or_pipe(tmp_path / "gone", 10)
    with pytest.raises(FileRefused, match="Is a directory"):
        read_file_or_pipe(tmp_path, 10)


def test_a_fifo_no_program_writes_to_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    refused = outcome_within(
        lambda: read_file_or_pipe(fifo, 10),
        unblock=lambda: open_fifo_writer_briefly(fifo),
        what="reading a FIFO no program writes to",
    )

    assert isinstance(refused, FileRefused)
    assert refused.reason.startswith("a named pipe (FIFO) that no program writes to")


def test_a_pipe_whose_writer_sends_nothing_is_given_up_on_after_the_wait(
    silent_pipe: Path,
) -> None:
    refused = outcome_within(
        lambda: read_file_or_pipe(silent_pipe, 10, wait=0.05), what="reading a silent pipe"
    )

    assert isinstance(refused, FileRefused)
    assert refused.reason == "its writer sent no end within 0.05 seconds"
