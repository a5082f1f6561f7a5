"""The database fails over to a standby that had not received the last events: the log the
store reconnects to ends before its fold, or goes on with other events at the same
positions. The store notices at its next catch-up, or when the log refuses its next append,
and folds the standby's log afresh."""

from __future__ import annotations

from typing import Any, cast

from app.domain.envelope import Meta
from app.domain.events import ModelDeclared, ReplicaPlaced, ShardPlacement, replica_stream
from app.domain.model_spec import ModelSpec
from app.store.folded import FoldedEventStore
from app.store.interface import NO_STREAM, NewEvent
from app.store.memory import InMemoryRecorder
from app.store.recorder import Recorder

META = Meta(actor="operator:test")


class FailingOverRecorder:
    """One database address: it answers with ``current``, the primary until a test fails it
    over to a standby."""

    def __init__(self, current: InMemoryRecorder) -> None:
        self.current = current

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


def declared(model: str) -> NewEvent:
    return NewEvent(ModelDeclared(model=model, spec=ModelSpec(name=model, command="sim")))


def placed(model: str, number: int) -> NewEvent:
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(number,), port=20000 + number)
    return NewEvent(
        ReplicaPlaced(replica_id=f"{model}-{number}", model=model, number=number, shards=(shard,))
    )


async def place(store: FoldedEventStore, model: str, number: int) -> None:
    await store.append(
        replica_stream(f"{model}-{number}"), NO_STREAM, [placed(model, number)], META
    )


def standby_of(primary: InMemoryRecorder, received: int) -> InMemoryRecorder:
    """A standby that received the primary's first ``received`` events."""
    standby = InMemoryRecorder()
    for stored in primary.log[:received]:
        standby.insert(stored)
    return standby


async def a_fold_of_three_replicas() -> tuple[FoldedEventStore, FailingOverRecorder]:
    primary = InMemoryRecorder()
    address = FailingOverRecorder(primary)
    store = FoldedEventStore(cast(Recorder, address))
    await store.append("model-m", NO_STREAM, [declared("m")], META)
    for number in (1, 2, 3):
        await place(store, "m", number)
    return store, address


async def test_a_log_that_ends_before_the_fold_is_folded_afresh() -> None:
    store, address = await a_fold_of_three_replicas()
    address.current = standby_of(address.current, received=2)

    state = await store.catch_up()

    assert state.position == 2
    assert sorted(state.replicas) == ["m-1"]
    assert store.known_version(replica_stream("m-3")) == 0


async def test_a_log_that_went_on_with_other_events_is_folded_afresh() -> None:
    store, address = await a_fold_of_three_replicas()
    standby = standby_of(address.current, received=2)
    address.current = standby
    other_writer = FoldedEventStore(standby)
    await other_writer.append("model-n", NO_STREAM, [declared("n")], META)
    await place(other_writer, "n", 1)
    await place(other_writer, "n", 2)  # the log is at position 4 again, with other events

    state = await store.catch_up()

    assert state.position == 5
    assert sorted(state.replicas) == ["m-1", "n-1", "n-2"]
    assert sorted(state.models) == sorted(other_writer.state.models) == ["m", "n"]
    assert store.known_version(replica_stream("m-3")) == 0


async def test_an_append_on_a_fold_the_log_fell_behind_lands_after_the_standby_log() -> None:
    store, address = await a_fold_of_three_replicas()
    address.current = standby_of(address.current, received=3)

    await place(store, "m", 5)

    assert [stored.stream for stored in address.current.log] == [
        "model-m",
        "replica-m-1",
        "replica-m-2",
        "replica-m-5",
    ]
    assert sorted(store.state.replicas) == ["m-1", "m-2", "m-5"]


async def test_a_fold_the_log_still_holds_is_not_folded_again() -> None:
    store, address = await a_fold_of_three_replicas()
    before = store.state
    other_writer = FoldedEventStore(address.current)
    await place(other_writer, "m", 4)

    state = await store.catch_up()

    assert state is before, "caught up in place, not rebuilt"
    assert state.position == 5


async def test_an_append_is_refused_where_the_log_reached_its_position_with_other_events() -> None:
    """The position alone says the fold is current; the event at it says it is not. The
    append is refused, the fold built again from the standby's log, and the append made on
    it."""
    store, address = await a_fold_of_three_replicas()
    standby = standby_of(address.current, received=3)
    address.current = standby
    other_writer = FoldedEventStore(standby)
    await other_writer.append("model-n", NO_STREAM, [declared("n")], META)
    assert len(standby.log) == store.state.position  # at the fold's position, not with m-3

    await place(store, "m", 4)

    assert [stored.stream for stored in standby.log] == [
        "model-m",
        "replica-m-1",
        "replica-m-2",
        "model-n",
        "replica-m-4",
    ]
    assert sorted(store.state.models) == ["m", "n"]
    assert sorted(store.state.replicas) == ["m-1", "m-2", "m-4"]
