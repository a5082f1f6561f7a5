"""An operator's change whose connection to PostgreSQL breaks once the append was sent: the
database may have committed it, and the server cannot know. The story each test tells: the
change is refused as of unknown outcome (never as failed, never as done), the next request
works without a restart, the server's fold then holds exactly what the log holds (compared
with a fresh replay), and asking again records nothing twice.

The server's store reaches the test database through a relay (``tests.support.tcp_relay``)
that breaks the one connection carrying ``llmgw_append`` right after it sent the call;
``pg_terminate_backend`` ends a backend waiting inside the call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from app.bootstrap import control_plane_engine
from app.domain.envelope import Recorded
from app.domain.events import ModelScaled, model_stream
from app.services.operations import Caller, Operations
from app.store.database import create_engine, driver_url
from app.store.errors import AppendOutcomeUnknown, StoreUnavailable
from app.store.postgres import APPEND_LOCK_KEY, PostgresEventStore
from app.store.projection import all_rows
from app.store.replay import replay
from tests.support.admin_server import bearer_client, problem_of, serving_admin
from tests.support.routing import declare_model
from tests.support.tcp_relay import Break, TcpRelay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = "outcome"
ALICE = Caller(actor="alice")
LEASE_S = 1.0
"""So that ``serve``'s pool gives up on a statement without an answer after 2 s."""
ANSWERED_WITHIN_S = 10.0
TOKEN = "outcome-token"


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str, relay: TcpRelay) -> AsyncIterator[PostgresEventStore]:
    """The store of ``serve``, with its pool as ``serve`` builds it, through the relay."""
    engine = control_plane_engine(relay.in_front_of(database_url), lease_s=LEASE_S)
    store = PostgresEventStore(engine)
    await declare_model(store, MODEL)
    yield store
    await engine.dispose()


async def _log(database_url: str) -> list[Recorded]:
    engine = create_engine(database_url, pool_size=1)
    try:
        return await PostgresEventStore(engine).read_all(0, 1000)
    finally:
        await engine.dispose()


async def scaled_events(database_url: str) -> list[int]:
    """The counts of the model's ``ModelScaled`` events in the log."""
    events = await _log(database_url)
    return [r.event.replicas for r in events if isinstance(r.event, ModelScaled)]


async def fold_equals_a_fresh_replay(database_url: str, store: PostgresEventStore) -> None:
    engine = create_engine(database_url, pool_size=1)
    try:
        replayed = await replay(engine)
    finally:
        await engine.dispose()
    assert store.state.position == replayed.position
    assert all_rows(store.state) == all_rows(replayed)


async def test_a_change_whose_connection_is_reset_after_sending_is_of_unknown_outcome(
    database_url: str, relay: TcpRelay, store: PostgresEventStore
) -> None:
    operations = Operations(store)
    broken = relay.break_after_sending(b"llmgw_append", Break.RESET)

    with pytest.raises(AppendOutcomeUnknown) as refused:
        await operations.scale(ALICE, MODEL, 3)

    assert broken.is_set()
    assert ALICE.request_id in str(refused.value), "it names what to look for in the log"
    # PostgreSQL got the whole call before the reset: it commits it.
    await wait_until(lambda: _scaled_to(database_url, [3]), what="the change in the log")
    # The next change on this server works at once (no broken connection left in its
    # pool), is decided on the log (the change above is there), and records nothing twice.
    assert await operations.scale(ALICE, MODEL, 3) is False
    assert (await operations.current()).models[MODEL].spec.replicas == 3
    assert await scaled_events(database_url) == [3]
    await fold_equals_a_fresh_replay(database_url, store)


async def test_a_change_whose_connection_is_cut_off_after_sending_is_answered_in_time(
    database_url: str, relay: TcpRelay, store: PostgresEventStore
) -> None:
    operations = Operations(store)
    broken = relay.break_after_sending(b"llmgw_append", Break.HOLD)
    change = asyncio.create_task(operations.scale(ALICE, MODEL, 3))
    try:
        await wait_until(
            change.done,
            within_s=ANSWERED_WITHIN_S,
            what="the change answered while its connection is cut off",
        )
        assert broken.is_set()
        with pytest.raises(AppendOutcomeUnknown):
            await change
        # The cut-off connection is still held open: the server works on new ones.
        assert await operations.scale(ALICE, MODEL, 4) is True
    finally:
        relay.mend()
        change.cancel()
    assert await scaled_events(database_url) == [3, 4]
    await fold_equals_a_fresh_replay(database_url, store)


async def test_a_change_whose_backend_is_terminated_is_of_unknown_outcome_not_an_error(
    database_url: str, store: PostgresEventStore
) -> None:
    operations = Operations(store)
    admin = await asyncpg.connect(driver_url(database_url))
    try:
        # The append waits for the append lock inside ``llmgw_append``; its backend is
        # ended there, as ``pg_terminate_backend`` or ``pg_ctl restart -m fast`` ends it.
        await admin.execute("SELECT pg_advisory_lock($1)", APPEND_LOCK_KEY)
        change = asyncio.create_task(operations.scale(ALICE, MODEL, 5))
        pid: list[int] = []

        async def appending() -> bool:
            pid[:] = (
                await admin.fetchval(
                    "SELECT array_agg(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%llmgw_append%'"
                )
                or []
            )
            return len(pid) == 1

        await wait_until(appending, what="the append waiting for the append lock")
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid[0])
        with pytest.raises(AppendOutcomeUnknown):
            await change
    finally:
        await admin.execute("SELECT pg_advisory_unlock_all()")
        await admin.close()
    assert await scaled_events(database_url) == []
    assert await operations.scale(ALICE, MODEL, 5) is True
    assert await scaled_events(database_url) == [5]
    await fold_equals_a_fresh_replay(database_url, store)


async def test_the_admin_api_answers_a_change_of_unknown_outcome_with_503_saying_so(
    database_url: str, relay: TcpRelay, store: PostgresEventStore
) -> None:
    async with (
        serving_admin(store, tokens={TOKEN: "alice"}) as url,
        bearer_client(url, TOKEN) as admin,
    ):
        relay.break_after_sending(b"llmgw_append", Break.RESET)
        answer = await admin.post(
            f"/admin/v1/models/{MODEL}/scale",
            json={"replicas": 3},
            headers={"x-request-id": "req-scale-once"},
        )
        problem = problem_of(answer, 503)
        assert problem["title"] == "outcome-unknown"
        assert "may or may not have been recorded" in problem["detail"]
        assert "[req-scale-once]" in problem["detail"]
        await wait_until(lambda: _scaled_to(database_url, [3]), what="the change in the log")
        model = (await admin.get(f"/admin/v1/models/{MODEL}")).json()
        assert model["desired"] == 3
        again = await admin.post(f"/admin/v1/models/{MODEL}/scale", json={"replicas": 3})
        assert again.status_code == 200, again.text
        assert again.json()["changed"] is False
    assert await scaled_events(database_url) == [3]
    await fold_equals_a_fresh_replay(database_url, store)


async def _scaled_to(database_url: str, counts: list[int]) -> bool:
    return await scaled_events(database_url) == counts


async def test_an_append_on_a_connection_closed_before_it_is_sent_is_known_unrecorded(
    database_url: str,
) -> None:
    """The pool hands out a connection whose backend ended while it was idle (a restart,
    ``pg_terminate_backend``): nothing is sent on it, so nothing can have been recorded."""
    engine = create_engine(database_url, pool_size=1)
    store = PostgresEventStore(engine)
    admin = await asyncpg.connect(driver_url(database_url))
    try:
        await declare_model(store, MODEL)
        pids = await admin.fetchval(
            "SELECT array_agg(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert len(pids) == 1, "the pool's one connection"
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pids[0])

        async def backend_gone() -> bool:
            return not await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pids[0]
            )

        # Its end reaches the pooled connection, which the driver marks closed.
        await wait_until(backend_gone, what="the pooled connection's backend gone")
        with pytest.raises(StoreUnavailable) as refused:
            await declare_model(store, MODEL, replicas=2)
        assert not isinstance(refused.value, AppendOutcomeUnknown), refused.value
        assert "nothing was recorded" in str(refused.value)
        await declare_model(store, MODEL, replicas=3)
        await fold_equals_a_fresh_replay(database_url, store)
    finally:
        await admin.close()
        await engine.dispose()


async def _append_elsewhere(database_url: str) -> None:
    """Another control plane appends: the store under test is one event behind the log."""
    elsewhere = create_engine(database_url, pool_size=1)
    try:
        await declare_model(PostgresEventStore(elsewhere), "elsewhere")
    finally:
        await elsewhere.dispose()


async def test_a_change_whose_commit_answer_is_lost_is_of_unknown_outcome(
    database_url: str, relay: TcpRelay, store: PostgresEventStore
) -> None:
    """An append that finds the log moved on is made again in a transaction holding the
    append lock, committed apart: here the connection breaks once ``COMMIT`` is sent."""
    await _append_elsewhere(database_url)
    broken = relay.break_after_sending(b"COMMIT", Break.RESET)

    with pytest.raises(AppendOutcomeUnknown):
        await declare_model(store, MODEL, replicas=2)

    assert broken.is_set()

    async def declared_twice() -> bool:
        events = await _log(database_url)
        return sum(1 for r in events if r.stream == model_stream(MODEL)) == 2

    await wait_until(declared_twice, what="the committed change in the log")
    await store.catch_up()
    await fold_equals_a_fresh_replay(database_url, store)
    assert store.state.models[MODEL].spec.replicas == 2


async def test_a_change_whose_commit_is_lost_leaves_a_fold_that_the_next_read_corrects(
    database_url: str, relay: TcpRelay, store: PostgresEventStore
) -> None:
    """The same, with ``COMMIT`` lost on the way: PostgreSQL rolls the change back, while
    the fold took it before committing. The next read of the log finds the fold ahead of
    it and builds the fold again."""
    await _append_elsewhere(database_url)
    broken = relay.break_after_sending(b"COMMIT", Break.LOST)

    with pytest.raises(AppendOutcomeUnknown):
        await declare_model(store, MODEL, replicas=2)

    assert broken.is_set()
    state = await store.catch_up()
    assert state.models[MODEL].spec.replicas == 1
    await fold_equals_a_fresh_replay(database_url, store)
    assert sum(1 for r in await _log(database_url) if r.stream == model_stream(MODEL)) == 1
