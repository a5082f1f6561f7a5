"""A node that is not connected keeps why its last connection ended, as the log says, until
its agent connects again; a reason longer than a cordon's is kept shortened."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from app.domain.envelope import Meta, Recorded
from app.domain.events import AnyEvent, NodeConnected, NodeDisconnected, NodeLost, NodeRegistered
from app.domain.evolve import replay
from app.domain.free_text import MAX_REASON_LENGTH
from app.domain.state import ClusterState

T0 = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)
NODE = "gpu-07"


def _fold(*events: AnyEvent) -> ClusterState:
    return replay(
        Recorded(
            position=n,
            stream=f"node-{NODE}",
            version=n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(seconds=n),
            meta=Meta(actor="hub"),
            event=event,
        )
        for n, event in enumerate(events, start=1)
    )


CONNECTED = NodeConnected(node_id=NODE, address="127.0.0.7")


def test_a_disconnected_node_keeps_why_its_connection_ended() -> None:
    state = _fold(CONNECTED, NodeDisconnected(node_id=NODE, reason="certificate revoked"))
    assert state.nodes[NODE].disconnect_reason == "certificate revoked"


def test_a_lost_node_still_says_why_it_was_disconnected() -> None:
    state = _fold(
        CONNECTED,
        NodeDisconnected(node_id=NODE, reason="heartbeat timeout"),
        NodeLost(node_id=NODE, disconnected_for_s=120.0),
    )
    assert state.nodes[NODE].lost
    assert state.nodes[NODE].disconnect_reason == "heartbeat timeout"


def test_a_reconnect_clears_the_reason() -> None:
    state = _fold(CONNECTED, NodeDisconnected(node_id=NODE, reason="protocol error"), CONNECTED)
    assert state.nodes[NODE].connected
    assert state.nodes[NODE].disconnect_reason is None


def test_a_node_never_disconnected_has_no_reason() -> None:
    state = _fold(NodeRegistered(node_id=NODE, address="127.0.0.7"), CONNECTED)
    assert state.nodes[NODE].disconnect_reason is None


def test_the_latest_disconnection_gives_the_reason() -> None:
    state = _fold(
        CONNECTED,
        NodeDisconnected(node_id=NODE, reason="heartbeat timeout"),
        CONNECTED,
        NodeDisconnected(node_id=NODE, reason="connection lost"),
    )
    assert state.nodes[NODE].disconnect_reason == "connection lost"


def test_a_long_reason_is_kept_shortened_to_a_cordons_length() -> None:
    state = _fold(CONNECTED, NodeDisconnected(node_id=NODE, reason="x" * 100_000))
    kept = state.nodes[NODE].disconnect_reason
    assert kept == "x" * (MAX_REASON_LENGTH - 1) + "…"
