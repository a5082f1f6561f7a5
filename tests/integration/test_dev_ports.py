"""``llmgw-dev``'s engine port blocks: one per state directory, never shared by two
running dev clusters, the same on the next run."""

from __future__ import annotations

import socket
from pathlib import Path

from devcluster.ports import BLOCK_FILE, BLOCK_PORTS, NODE_PORTS, claim_engine_ports, home_block


def test_two_state_directories_get_blocks_that_do_not_overlap(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = claim_engine_ports(tmp_path / "a")
    second = claim_engine_ports(tmp_path / "b")
    try:
        assert abs(first.first - second.first) >= BLOCK_PORTS
        assert first.node_range(0) == (first.first, first.first + NODE_PORTS - 1)
        assert first.node_range(1)[1] == first.first + BLOCK_PORTS - 1
    finally:
        first.release()
        second.release()


def test_the_next_run_gets_the_same_block_even_with_its_engines_still_listening(
    tmp_path: Path,
) -> None:
    block = claim_engine_ports(tmp_path)
    block.release()
    with socket.socket() as engine_left_running:
        engine_left_running.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        engine_left_running.bind(("127.0.0.1", block.first))
        engine_left_running.listen()

        again = claim_engine_ports(tmp_path)
        again.release()

    assert again.first == block.first
    assert (tmp_path / BLOCK_FILE).read_text() == f"{block.first}\n"


def test_a_block_claimed_by_a_running_dev_is_not_taken_even_if_recorded(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "copy").mkdir()
    running = claim_engine_ports(tmp_path / "a")
    (tmp_path / "copy" / BLOCK_FILE).write_text(f"{running.first}\n")
    try:
        other = claim_engine_ports(tmp_path / "copy")
        other.release()
    finally:
        running.release()

    assert other.first != running.first
    assert other.moved_from == running.first, "so that dev can warn that its replicas move"


def test_a_block_where_something_listens_is_skipped_for_a_new_state_directory(
    tmp_path: Path,
) -> None:
    probe = claim_engine_ports(tmp_path)
    probe.release()
    (tmp_path / BLOCK_FILE).unlink()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", probe.first + 150))
        squatter.listen()

        block = claim_engine_ports(tmp_path)
        block.release()

    assert block.first != probe.first


def test_a_stopped_dev_s_block_is_not_the_next_new_state_directory_s(tmp_path: Path) -> None:
    """A block is claimed only while its dev runs. If a new state directory took the lowest
    free block, a dev stopped and started again would find its block taken by whichever
    state directory started in between, its agents given other ports than its replicas were
    placed on, and its replicas unable to start."""
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    claim_engine_ports(stopped).release()
    recorded = int((stopped / BLOCK_FILE).read_text())
    newcomer = next(
        tmp_path / f"new-{n}" for n in range(100) if home_block(tmp_path / f"new-{n}") != recorded
    )
    newcomer.mkdir()

    block = claim_engine_ports(newcomer)
    block.release()

    assert block.first != recorded
