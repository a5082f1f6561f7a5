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
