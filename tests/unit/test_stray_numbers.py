"""An engine stopped as a stray takes its replica number out of use: after a failover that
lost a replica's placement, its engine is still reported, stopped, and its id is never
handed to a new replica. A node cannot push a model's count anywhere it likes."""

from __future__ import annotations

import pytest

from app.domain.envelope import Meta
from app.domain.events import StrayStopped, node_stream
from app.domain.evolve.nodes import STRAY_NUMBERS_BELIEVED
from app.store.interface import NO_STREAM, NewEvent
from app.store.memory import InMemoryEventStore
from tests.unit.test_fold_after_failover import declared, place

META = Meta(actor="reconciler", epoch=2)


def stray(replica_id: str, model: str = "m") -> NewEvent:
    return NewEvent(
        StrayStopped(
            node_id="gpu-1",
            replica_id=replica_id,
            shard_index=0,
            model=model,
            port=20003,
            pid=4242,
            rule="the log knows no such replica",
        )
    )


async def a_model_with_two_replicas() -> InMemoryEventStore:
    store = InMemoryEventStore()
    await store.append("model-m", NO_STREAM, [declared("m")], META)
    await place(store, "m", 1)
    await place(store, "m", 2)
    return store


async def test_a_stray_of_a_number_the_log_never_placed_takes_that_number() -> None:
    store = await a_model_with_two_replicas()

    await store.append(node_stream("gpu-1"), None, [stray("m-3")], META)

    assert store.state.models["m"].replicas_created == 3


@pytest.mark.parametrize(
    "replica_id",
    ["m-1", "m-x", "m-٣", f"m-{2 + STRAY_NUMBERS_BELIEVED + 1}", "mm-9", "n-9"],
)
async def test_other_names_leave_the_count_alone(replica_id: str) -> None:
    store = await a_model_with_two_replicas()

    await store.append(node_stream("gpu-1"), None, [stray(replica_id)], META)

    assert store.state.models["m"].replicas_created == 2
