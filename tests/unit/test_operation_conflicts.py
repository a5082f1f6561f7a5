"""Stories of two operators changing one thing at the same moment, on the in-memory store:
the one whose change lost the race is refused (409 ``conflict``) with what it met, whose
change and what it did, and nothing of it is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.domain.envelope import Meta, Recorded
from app.domain.model_spec import ModelSpec
from app.services.conflicts import ChangeConflict, conflict_met
from app.services.operations import Caller, Operations
from app.store.errors import ConcurrencyError
from app.store.interface import NewEvent
from app.store.memory import InMemoryEventStore

ALICE = Caller(actor="alice", request_id="req-alice")
BOB = Caller(actor="bob", request_id="req-bob")


class SlowWritingStore(InMemoryEventStore):
    """The in-memory store whose appends take a turn of the loop to reach the log, as
    PostgreSQL's do: another request decides on the same log meanwhile."""

    async def append(
        self, stream: str, expected_version: int | None, events: Sequence[NewEvent], meta: Meta
    ) -> list[Recorded]:
        await asyncio.sleep(0)
        return await super().append(stream, expected_version, events, meta)


async def test_the_scale_that_lost_the_race_names_the_scale_it_met_and_records_nothing() -> None:
    store = SlowWritingStore()
    operations = Operations(store)
    await operations.apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    before = len(await store.read_all())

    answers = await asyncio.gather(
        operations.scale(ALICE, "llama", 3),
        operations.scale(BOB, "llama", 5),
        return_exceptions=True,
    )

    [won] = [a for a in answers if a is True]
    [lost] = [a for a in answers if isinstance(a, BaseException)]
    assert won is True
    assert isinstance(lost, ChangeConflict)
    [met] = lost.met
    assert (met.meta.actor, met.position) == ("alice", before + 1)
    assert str(lost) == (
        "another change came first: model llama scaled from 1 to 3 replica(s) (by alice, "
        f"position {before + 1}); nothing was written: send it again to "
        "decide on the cluster as it is now"
    )
    assert len(await store.read_all()) == before + 1
    assert (await operations.current()).models["llama"].spec.replicas == 3


async def test_a_conflict_names_the_newest_changes_it_met_and_counts_the_earlier() -> None:
    store = InMemoryEventStore()
    operations = Operations(store)
    await operations.apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    version = store.known_version("model-llama")
    for count in (2, 3, 4, 5):
        await operations.scale(BOB, "llama", count)
    lost = ConcurrencyError("model-llama", version, version + 4)
    conflict = await conflict_met(store, lost)

    assert [r.meta.actor for r in conflict.met] == ["bob"] * 3
    assert str(conflict).startswith(
        "4 other changes came first, the newest 3: model llama scaled from 2 to 3 replica(s) "
        "(by bob, position "
    )
