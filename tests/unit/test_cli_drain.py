"""What `drain` prints: a warning per replica with nowhere to go, and off a terminal with
--wait, each wait for room while a drain has nowhere to move a replica."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from cli.drain import no_room_warnings, print_new_steps
from cli.views import (
    DrainAccepted,
    DrainProgressView,
    MoveView,
    ReplicaRoomView,
    ReplicaSummary,
)

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
