"""What `drain` prints: a warning per replica with nowhere to go, a line per such replica
when --require-room refuses the drain, and off a terminal with --wait, each wait for room
while a drain has nowhere to move a replica."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from rich.console import Console

from app.domain.events import EVENT_TYPES
from cli.client import EventView
from cli.config import ConnectionFlags
from cli.drain import (
    NO_ROOM_SHOWN,
    drain,
    drain_progress,
    no_room_warnings,
    print_new_steps,
    render,
)
from cli.views import (
    DrainAccepted,
    DrainProgressView,
    MoveView,
    ReplicaRoomView,
    ReplicaSummary,
)
from tests.support.stub_admin import StubHandler, stub_admin_api

NO_ROOM = "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 2: 1 draining"


def stuck(waiting_for: str | None) -> DrainProgressView:
    return DrainProgressView(
        drain_id="drain-0a1b2c3d",
        node_id="gpu-1",
        grace_ends_at=datetime(2026, 12, 4, 17, 5, tzinfo=UTC),
        replicas=[ReplicaSummary(id="llama-3", model="llama", phase="draining")],
        moves=[MoveView(replica_id="llama-3", revision=1, waiting_for=waiting_for)],
    )


def printed(*polls: DrainProgressView) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=200)
    shown: set[int | str] = set()
    for progress in polls:
        print_new_steps(console, progress, shown)
    return out.getvalue().splitlines()


def test_a_wait_for_room_is_printed_once_with_its_reason_and_the_grace_s_end() -> None:
    lines = printed(stuck(NO_ROOM), stuck(NO_ROOM), stuck(NO_ROOM))

    assert lines == [
        f"llama-3 waits for a replacement: {NO_ROOM} (llmgw-cli explain-placement llama)",
        "at 2026-12-04 17:05:00 UTC the grace runs out: what is still on the node then is "
        "stopped, not moved",
    ]


def test_a_new_reason_is_printed_when_placement_changes_its_mind() -> None:
    lines = printed(stuck(None), stuck(NO_ROOM))

    assert lines[0] == "llama-3 waits for a replacement: placement has not run yet"
    assert lines[2].startswith(f"llama-3 waits for a replacement: {NO_ROOM}")


def test_a_finished_drain_prints_no_wait() -> None:
    done = DrainProgressView(
        drain_id="drain-0a1b2c3d",
        finished=True,
        state="failed",
        moves=[MoveView(replica_id="llama-3", waiting_for=NO_ROOM)],
    )

    assert printed(done) == []


def test_a_drain_warns_once_per_replica_without_room_and_says_what_its_grace_does() -> None:
    accepted = DrainAccepted(
        drain_id="drain-0a1b2c3d",
        grace_s=600.0,
        room=[
            ReplicaRoomView(replica_id="llama-2", model="llama", has_room=True),
            ReplicaRoomView(replica_id="llama-3", model="llama", has_room=False, reason=NO_ROOM),
        ],
    )

    assert no_room_warnings(accepted) == [
        f"warning: llama-3 has nowhere to go now: {NO_ROOM} (llmgw-cli explain-placement "
        "llama); when the 600s grace runs out it is stopped, not moved"
    ]
    assert no_room_warnings(DrainAccepted(drain_id="drain-0a1b2c3d")) == []  # a replica drain


def test_a_drain_warns_of_at_most_so_many_replicas_and_counts_the_rest() -> None:
    room = [
        ReplicaRoomView(replica_id=f"llama-{n}", model="llama", has_room=False, reason=NO_ROOM)
        for n in range(NO_ROOM_SHOWN + 5)
    ]

    warnings = no_room_warnings(DrainAccepted(drain_id="drain-0a1b2c3d", room=room))

    assert len(warnings) == NO_ROOM_SHOWN + 1
    assert warnings[-1] == (
        "warning: and 5 more replica(s) with nowhere to go; when the grace runs out they are "
        "stopped, not moved"
    )


class Refusing(StubHandler):
    """An admin API that refuses every request with ``document``, as ``status``."""

    document: object = {}
    status = 409

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.do_GET()

    def do_GET(self) -> None:
        body = json.dumps(self.document).encode()
        self.answer(self.status, "application/problem+json", body)


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with stub_admin_api(Refusing, monkeypatch) as url:
        yield url


def refused_drain(
    admin_url: str,
    document: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, list[str]]:
    """``drain gpu-1 --require-room`` refused with ``document``: its exit code and the
    lines it wrote on stderr (none on stdout)."""
    monkeypatch.setattr(Refusing, "document", document)
    code = drain("gpu-1", require_room=True, connection=ConnectionFlags(admin_url=admin_url))
    captured = capsys.readouterr()
    assert captured.out == ""
    return code, captured.err.splitlines()


def no_room_to_drain(room: list[dict[str, object]]) -> dict[str, object]:
    return {
        "type": "https://llmgw.dev/problems/no-room-to-drain",
        "title": "no-room-to-drain",
        "status": 409,
        "detail": "node gpu-1 was not drained: the API's own words",
        "room": room,
    }


def test_a_refused_drain_names_every_replica_without_room_a_line_each_escaped(
    admin_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the refusal was the problem's detail alone, one line naming at most 8.
    room: list[dict[str, object]] = [
        {"replica_id": f"llama-{n}", "model": "llama", "has_room": False, "reason": NO_ROOM}
        for n in range(1, 11)
    ]
    room[3]["replica_id"] = "llama-\x1b]0;owned\x07\n4"
    room.append({"replica_id": "qwen-1", "model": "qwen", "has_room": True, "reason": None})

    code, lines = refused_drain(admin_url, no_room_to_drain(room), monkeypatch, capsys)

    assert code == 1
    assert lines[0] == (
        "llmgw-cli drain: node gpu-1 was not drained: 10 of 11 replica(s) on it have nowhere "
        "to go now; nothing was recorded"
    )
    shown = [f"llama-{n}" for n in range(1, 11)]
    shown[3] = "llama-\\x1b]0;owned\\x07\\n4"  # as escape_controls writes it
    assert lines[1:] == [
        f"  {replica} has nowhere to go now: {NO_ROOM} (llmgw-cli explain-placement llama)"
        for replica in shown
    ]


def test_a_refused_drain_names_at_most_so_many_replicas_and_counts_the_rest(
    admin_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    room: list[dict[str, object]] = [
        {"replica_id": f"llama-{n}", "has_room": False} for n in range(NO_ROOM_SHOWN + 1000)
    ]

    code, lines = refused_drain(admin_url, no_room_to_drain(room), monkeypatch, capsys)

    assert code == 1
    assert len(lines) == 1 + NO_ROOM_SHOWN + 1
    assert lines[1] == "  llama-0 has nowhere to go now: no reason given"
    assert lines[-1] == "  and 1000 more replica(s) with nowhere to go"


@pytest.mark.parametrize(
    "room", [None, "full", [{"has_room": False}], [{"replica_id": ["x"]}]], ids=repr
)
def test_a_refusal_whose_room_is_not_the_apis_list_is_said_by_its_detail(
    admin_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    room: object,
) -> None:
    document = no_room_to_drain([])
    document["room"] = room

    code, lines = refused_drain(admin_url, document, monkeypatch, capsys)

    assert code == 1
    assert lines == ["llmgw-cli drain: node gpu-1 was not drained: the API's own words"]


def test_waiting_for_a_drain_that_is_not_known_says_so_and_not_that_it_goes_on(
    admin_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the answer was "no drain 'drain-0a1b2c3d' is known (the drain goes on:
    # llmgw-cli drain-progress drain-0a1b2c3d --wait)": advice to wait for it again.
    monkeypatch.setattr(Refusing, "status", 404)
    monkeypatch.setattr(
        Refusing,
        "document",
        {"title": "unknown-drain", "status": 404, "detail": "no drain 'drain-0a1b2c3d' is known"},
    )

    code = drain_progress(
        "drain-0a1b2c3d", wait=True, connection=ConnectionFlags(admin_url=admin_url)
    )

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "llmgw-cli drain-progress: no drain 'drain-0a1b2c3d' is known"
    ]


def test_a_drain_of_an_empty_node_says_so_rather_than_drawing_an_empty_table() -> None:
    """`llmgw-cli drain NODE --wait` of a node nothing ran on drew a `replicas` table of
    headers alone."""
    empty = DrainProgressView(
        drain_id="drain-0a1b2c3d",
        node_id="gpu-1",
        finished=False,
        state="running",
        outcome="",
    )
    out = io.StringIO()

    Console(file=out, width=100).print(render(empty, steps=False))

    shown = out.getvalue()
    assert "no replica was on the node" in shown, shown
    assert "model" not in shown, shown


def test_a_cancelled_drain_says_which_replicas_still_on_the_node_had_their_move_called_off() -> (
    None
):
    cancelled = DrainProgressView(
        drain_id="drain-0a1b2c3d",
        node_id="gpu-1",
        finished=True,
        state="cancelled",
        outcome="cancelled by bob",
        replicas=[ReplicaSummary(id="llama-1", model="llama", phase="serving")],
        still_on_node=["llama-1", "llama-2"],
        moves_called_off=["llama-1"],
    )
    out = io.StringIO()

    Console(file=out, width=200).print(render(cancelled, steps=False))

    assert "still on the node: llama-1 (its move called off), llama-2\n" in out.getvalue()


def test_a_finished_drain_of_an_empty_node_says_so_once() -> None:
    """Its outcome says it: a second line saying the same again is noise."""
    finished = DrainProgressView(
        drain_id="drain-0a1b2c3d",
        node_id="gpu-1",
        finished=True,
        state="succeeded",
        outcome="no replica was serving on the node",
    )
    out = io.StringIO()

    Console(file=out, width=100).print(render(finished, steps=False))

    shown = out.getvalue()
    assert "done: no replica was serving on the node" in shown, shown
    assert "no replica was on the node" not in shown, shown
    assert "model" not in shown, shown


def test_each_step_of_a_drain_has_its_summary_in_one_column_whatever_its_type() -> None:
    """`drain --wait` off a terminal prints a step a line, the event type padded: a type
    wider than the padding (`replica_drain_cancelled`) pushed its summary out of line."""
    steps = [
        EventView(
            position=position,
            recorded_at=datetime(2026, 12, 4, 17, 0, tzinfo=UTC),
            stream="node-gpu-1",
            type=event_type,
            actor="reconciler",
            summary=f"step {position}",
        )
        for position, event_type in enumerate(sorted(EVENT_TYPES, key=len), start=1)
    ]
    progress = DrainProgressView(drain_id="drain-0a1b2c3d", node_id="gpu-1", events=steps)

    lines = printed(progress)

    assert len({line.index(f"step {n}") for n, line in enumerate(lines, start=1)}) == 1, lines
