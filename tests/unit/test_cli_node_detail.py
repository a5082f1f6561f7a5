"""`llmgw-cli node ID` says since when the node is connected, lost or disconnected; the time
belongs to the connection, never to a cordon the API gives no time for."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cli.nodes import print_node
from cli.views import ConnectionView, NodeDrainView, NodeView

CONNECTED_AT = datetime(2026, 12, 5, 4, 21, 5, tzinfo=UTC)


def _state_line(capsys: pytest.CaptureFixture[str], node: NodeView) -> str:
    print_node(node)
    lines = capsys.readouterr().out.splitlines()
    return next(line for line in lines if line.startswith("state:")).removeprefix("state:").strip()


def test_a_cordoned_node_is_connected_since_its_connection_not_cordoned_since_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = NodeView(
        id="dev-node-1",
        connection=ConnectionView(connected=True, since=CONNECTED_AT),
        cordoned=True,
        cordon_reason="ECC errors on GPU 3",
    )
    assert _state_line(capsys, node) == "connected since 2026-12-05 04:21:05 UTC, cordoned"


@pytest.mark.parametrize(
    ("connected", "lost", "shown"),
    [
        (True, False, "connected since 2026-12-05 04:21:05 UTC"),
        (False, False, "disconnected since 2026-12-05 04:21:05 UTC"),
        (False, True, "lost since 2026-12-05 04:21:05 UTC"),
    ],
)
def test_the_time_follows_the_connection_state(
    capsys: pytest.CaptureFixture[str], connected: bool, lost: bool, shown: str
) -> None:
    node = NodeView(
        id="gpu-07", connection=ConnectionView(connected=connected, lost=lost, since=CONNECTED_AT)
    )
    assert _state_line(capsys, node) == shown


def test_a_draining_node_says_so_after_its_connection(capsys: pytest.CaptureFixture[str]) -> None:
    node = NodeView(
        id="gpu-07",
        connection=ConnectionView(connected=True, since=CONNECTED_AT),
        cordoned=True,
        drain=NodeDrainView(drain_id="drain-4e1c"),
    )
    assert _state_line(capsys, node) == "connected since 2026-12-05 04:21:05 UTC, cordoned"


def _facts(capsys: pytest.CaptureFixture[str], node: NodeView) -> dict[str, str]:
    print_node(node)
    lines = capsys.readouterr().out.splitlines()
    pairs = (line.split(":", 1) for line in lines if ":" in line and not line.startswith(" "))
    return {name.strip(): value.strip() for name, value in pairs}


@pytest.mark.parametrize("lost", [False, True])
def test_a_node_not_connected_says_why_its_connection_ended(
    capsys: pytest.CaptureFixture[str], lost: bool
) -> None:
    node = NodeView(
        id="gpu-07",
        connection=ConnectionView(
            connected=False,
            lost=lost,
            since=CONNECTED_AT,
            disconnect_reason="certificate revoked",
        ),
    )
    assert _facts(capsys, node)["disconnected"] == "certificate revoked"


def test_a_connected_node_shows_no_reason_of_an_old_disconnection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = NodeView(
        id="gpu-07",
        connection=ConnectionView(
            connected=True, since=CONNECTED_AT, disconnect_reason="heartbeat timeout"
        ),
    )
    assert "disconnected" not in _facts(capsys, node)


def test_a_reason_holding_an_escape_sequence_is_shown_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = NodeView(
        id="gpu-07",
        connection=ConnectionView(connected=False, disconnect_reason="bad frame \x1b[2J"),
    )
    print_node(node)
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "bad frame" in out
