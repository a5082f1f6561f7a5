"""What an append the driver refused to send says: nothing was recorded, and why, in words
an operator reads, never the driver's internal state machine.

The driver's internal error comes from a connection the server ended while it sat in the
pool, at a moment no test can choose (tests/integration/test_append_outcome_unknown.py
ends one for real and gets whichever refusal the driver reaches first), so here the
connection is one that refuses as the driver does."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import cast

import asyncpg
import pytest

from app.domain.envelope import Meta, Recorded
from app.domain.events import NodeCordoned
from app.store.errors import AppendOutcomeUnknown, StoreUnavailable
from app.store.postgres import PostgresSession
from app.store.projection import RowChanges

DRIVER_STATE = "cannot switch to state 11; another operation (2) is in progress"
"""What asyncpg says of a connection the server ended while it sat in the pool."""

CLOSED = "cannot perform operation: connection is closed"

META = Meta(actor="alice")
NO_ROWS = RowChanges(touched={"models": [], "nodes": [], "replicas": [], "api_keys": []}, rows={})


class RefusingConnection:
    """A driver connection that refuses to send anything, as asyncpg's does once it knows
    (or finds mid-call) that the server ended it."""

    def __init__(self, refusal: Exception) -> None:
        self.refusal = refusal

    async def fetch(self, *args: object) -> list[object]:
        raise self.refusal

    def is_in_transaction(self) -> bool:
        return False


async def refused_append(refusal: Exception) -> StoreUnavailable:
    session = PostgresSession(cast(asyncpg.Connection, RefusingConnection(refusal)), "events")
    cordoned = Recorded(
        position=1,
        stream="node-gpu-1",
        version=1,
        event_id=uuid.uuid4(),
        recorded_at=datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
        meta=META,
        event=NodeCordoned(node_id="gpu-1", reason="new firmware"),
    )
    with pytest.raises(StoreUnavailable) as refused:
        await session.record([cordoned], NO_ROWS, META, 0, None)
    assert not isinstance(refused.value, AppendOutcomeUnknown), refused.value
    return refused.value


async def test_a_connection_ended_in_the_pool_is_said_in_plain_words_not_the_driver_s() -> None:
    error = await refused_append(asyncpg.InternalClientError(DRIVER_STATE))

    assert str(error) == (
        "the connection to the database had been ended before the change was sent (its "
        "session was ended by an administrator or a timeout, or the database restarted or "
        "failed over); nothing was recorded"
    )


async def test_a_connection_the_driver_knows_is_closed_says_so() -> None:
    error = await refused_append(asyncpg.InterfaceError(CLOSED))

    assert str(error) == (
        f"database connection lost before the change was sent ({CLOSED}); nothing was recorded"
    )
