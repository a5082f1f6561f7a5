"""A drain's progress (``GET /admin/v1/drains/{id}``, what ``llmgw-cli drain --wait`` polls)
read on the in-memory store: it sees the drain's end however many steps the drain took,
and its answer stays bounded."""

from __future__ import annotations

from datetime import UTC, datetime

from app.domain.drain import NODE_DRAIN_COMPLETE
from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, NodeDrainFinished, node_stream
from app.services.agent_reports import ReportRecorder
from app.services.operations import DRAIN_EVENTS_SHOWN, Caller, Operations
from app.store.interface import NewEvent
from app.store.memory import InMemoryEventStore
from tests.unit.test_services_in_memory import hello

ALICE = Caller(actor="alice", request_id="req-1")
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


async def test_a_drain_with_more_steps_than_the_view_shows_is_seen_to_finish() -> None:
    store = InMemoryEventStore()
    operations = Operations(store, clock=lambda: T0)
    await ReportRecorder(store).handle(hello("gpu-1"))
    drain_id = (await operations.drain_node(ALICE, "gpu-1", 600)).drain_id
    # A long drain: many steps carry its id before it finishes (retries of a big node).
    step = NodeCordoned(node_id="gpu-1", reason=f"drain {drain_id}")
    meta = Meta(actor="reconciler", correlation_id=drain_id)
    steps = [NewEvent(step) for _ in range(DRAIN_EVENTS_SHOWN + 50)]
    await store.append(node_stream("gpu-1"), None, steps, meta)
    finished = NodeDrainFinished(node_id="gpu-1", drain_id=drain_id, outcome=NODE_DRAIN_COMPLETE)
    await store.append(node_stream("gpu-1"), None, [NewEvent(finished)], meta)

    progress = await operations.drain(drain_id)

    assert (progress.finished, progress.outcome) == (True, NODE_DRAIN_COMPLETE)
    assert (progress.node_id, progress.requested_by) == ("gpu-1", "alice")
    assert len(progress.events) <= DRAIN_EVENTS_SHOWN
    assert progress.events[-1].event == finished
