"""Reading the end of an engine log."""

from __future__ import annotations

from pathlib import Path

from agent.engines.logtail import last_lines, read_log_tail


def test_the_tail_of_a_large_log_is_its_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with log.open("w") as file:
        for number in range(200_000):
            file.write(f"INFO step {number} tokens/s 1234.5\n")

    tail = read_log_tail(log, 100)

    assert tail == [f"INFO step {number} tokens/s 1234.5" for number in range(199_900, 200_000)]


def test_a_log_shorter_than_the_tail_is_returned_whole(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("loading\nready\n")

    assert read_log_tail(log, 100) == ["loading", "ready"]


def test_a_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("a\nb\nTraceback (most recent call last):")

    assert read_log_tail(log, 2) == ["b", "Traceback (most recent call last):"]


def test_an_endless_line_costs_no_more_than_the_byte_budget(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"x" * 5_000_000 + b"\nboom\n")

    tail = read_log_tail(log, 100, max_bytes=64 * 1024)

    assert tail[-1] == "boom"
    assert sum(len(line) for line in tail) < 64 * 1024


def test_a_missing_log_has_no_tail(tmp_path: Path) -> None:
    assert read_log_tail(tmp_path / "never-written.log") == []


def test_carriage_returns_do_not_split_lines_and_bad_bytes_are_replaced() -> None:
    data = b"Loading 10%\rLoading 100%\r\nweights \xff ok\n"

    assert last_lines(data, 5) == ["Loading 10%\rLoading 100%", "weights \ufffd ok"]
