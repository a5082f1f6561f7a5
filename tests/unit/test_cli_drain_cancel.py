"""What `drain-cancel` prints, and how `drain --wait` / `drain-progress --wait` of a drain an
operator called off end: saying it was cancelled and by whom, exit 1 (the node was not
emptied), while the one who cancelled it and waits gets 0."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cli.config import ConnectionFlags
from cli.drain import drain_progress
from cli.drain_cancel import drain_cancel
from tests.support.stub_admin import StubHandler, stub_admin_api

DRAIN = "drain-0a1b2c3d"
CANCELLED = {
    "drain_id": DRAIN,
    "node_id": "gpu-8",
    "requested_by": "alice",
    "requested_at": "2026-12-04T17:00:00Z",
    "state": "cancelled",
    "finished": True,
    "outcome": "cancelled by bob",
}


class CancelledDrain(StubHandler):
    changed = True
    posted: list[str] = []

    def do_GET(self) -> None:
        self.answer(200, "application/json", json.dumps(CANCELLED).encode())

    def do_POST(self) -> None:
        self.posted.append(self.path)
        drain = {**CANCELLED, "state": "running", "finished": False, "outcome": None}
        body = json.dumps({"changed": self.changed, "drain": drain}).encode()
        self.answer(200, "application/json", body)


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectionFlags]:
    monkeypatch.setattr(CancelledDrain, "posted", [])
    with stub_admin_api(CancelledDrain, monkeypatch) as url:
        yield ConnectionFlags(admin_url=url)


def test_a_cancel_says_what_it_did_and_what_is_left_to_the_operator(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    code = drain_cancel(DRAIN, connection=connection)

    assert code == 0
    assert CancelledDrain.posted == [f"/admin/v1/drains/{DRAIN}/cancel"]
    assert capsys.readouterr().out.splitlines() == [
        f"{DRAIN}: cancelled; its moves under way are called off",
        "node gpu-8 stays cordoned: llmgw-cli uncordon gpu-8 once it may take replicas again",
        f"follow it: llmgw-cli drain-progress {DRAIN} --wait",
    ]


def test_a_repeated_cancel_says_nothing_was_recorded(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CancelledDrain, "changed", False)

    assert drain_cancel(DRAIN, connection=connection) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{DRAIN}: cancelled already, nothing recorded"
    )


def test_waiting_on_a_drain_another_operator_cancelled_ends_saying_so_with_exit_1(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    code = drain_progress(DRAIN, wait=True, connection=connection)

    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.splitlines() == [
        f"llmgw-cli drain-progress: {DRAIN} was cancelled: cancelled by bob"
    ]
    assert f"{DRAIN} drains node gpu-8" in captured.out
    assert "cancelled by bob" in captured.out


def test_the_operator_who_cancels_and_waits_gets_0_once_it_ended_cancelled(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    assert drain_cancel(DRAIN, wait=True, connection=connection) == 0
    assert capsys.readouterr().err == ""


def test_waiting_on_the_cancel_ends_saying_the_node_stays_cordoned(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drain's cordon outlives it, waited on or not: the operator is told what to run."""
    assert drain_cancel(DRAIN, wait=True, connection=connection) == 0

    assert capsys.readouterr().out.splitlines()[-1] == (
        "node gpu-8 stays cordoned: llmgw-cli uncordon gpu-8 once it may take replicas again"
    )
