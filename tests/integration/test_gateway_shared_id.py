"""Two gateway processes started with the same id: each report is kept apart, the leader's
reader sums both, and each of them says so. A gateway restarted with its
id is not taken for another: its previous lives' rows, their connections gone, are taken
back or retired at once."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.gateway.reporter import GatewayReporter, process_token
from app.store.database import driver_url
from app.store.gateway_reports import InFlightReports, hold_writer_lock
from tests.support.waiting import wait_until

INTERVAL_S = 0.05


@asynccontextmanager
async def gateway(
    database_url: str, gateway_id: str, in_flight: dict[str, int], shared: list[None]
) -> AsyncIterator[GatewayReporter]:
    """A gateway process's reporter, reporting ``in_flight``; ``shared`` gets an item for
    each report that finds the id shared."""
    reporter = GatewayReporter(
        database_url,
        gateway_id=gateway_id,
        in_flight=lambda: dict(in_flight),
        routing_position=lambda: None,
        report_interval_s=INTERVAL_S,
        on_shared_id=lambda: shared.append(None),
    )
    await reporter.start()
    try:
        yield reporter
    finally:
        await reporter.close()


def in_flight_on(reports: InFlightReports, replica: str) -> Callable[[], object]:
    async def read() -> int:
        return (await reports.read_in_flight()).get(replica, 0)

    return read


async def test_two_gateways_with_one_id_are_both_counted_and_both_say_so(
    engine: AsyncEngine, database_url: str
) -> None:
    same_id, replica = f"gw-{secrets.token_hex(4)}", f"r-{secrets.token_hex(4)}"
    reports = InFlightReports(engine)
    read = in_flight_on(reports, replica)
    first_shared: list[None] = []
    second_shared: list[None] = []

    with capture_logs() as logs:
        async with gateway(database_url, same_id, {replica: 2}, first_shared) as first:
            await wait_until(lambda: first.reports >= 1, what="the first gateway's report")
            async with gateway(database_url, same_id, {replica: 3}, second_shared) as second:

                async def summed() -> bool:
                    return await read() == 5

                # Each writes its own row: the leader reads both gateways' requests.
                await wait_until(summed, within_s=3.0, what="both gateways' requests summed")
                # Each finds the other's row: whichever log an operator reads says so.
                await wait_until(
                    lambda: bool(first_shared) and bool(second_shared),
                    what="the shared id counted by both",
                )
                assert first.reports_as == same_id
                assert second.reports_as == f"{same_id}@{second.instance}"

            # The second stopped cleanly: its own row went, the first's stays.
            assert await read() == 2
            assert first.reports_as == same_id
        assert await read() == 0

    errors = [e for e in logs if e["event"] == "gateway_id_shared"]
    # Once each (at most once a minute), however many reports.
    assert sorted(e["reports_as"] for e in errors) == sorted(
        [same_id, f"{same_id}@{second.instance}"]
    ), errors
    assert {e["log_level"] for e in errors} == {"error"}
    assert {e["gateway_id"] for e in errors} == {same_id}
    # Both connected all along: neither retired the other's row.
    assert not [e for e in logs if e["event"] == "gateway_reports_retired"]


async def connected_as(database_url: str, token: str) -> asyncpg.Connection:
    """A connection as a gateway process's reporter holds it: what says the process whose
    token is ``token`` is alive."""
    db = await asyncpg.connect(driver_url(database_url))
    assert await hold_writer_lock(db, token, within_s=5.0)
    return db


async def test_a_gateway_restarted_elsewhere_takes_its_previous_lives_rows_at_once(
    engine: AsyncEngine, database_url: str
) -> None:
    """Before, a previous life on another host (or whose pid now runs something else) that
    had reported just now was left to age: its requests counted for 5 s more, then it
    counted as a silent gateway for 30 s, holding every stop of a drained replica. Its
    connection is gone: its rows go at once, and nothing says the id is shared."""
    stale_id, fresh_id = f"gw-{secrets.token_hex(4)}", f"gw-{secrets.token_hex(4)}"
    replica = f"r-{secrets.token_hex(4)}"
    db = await asyncpg.connect(driver_url(database_url))
    try:
        # Previous lives that were killed, leaving their reports: one 6 s ago, one just now,
        # and one just now under a key of its own (itself a restarted life).
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, instance, reported_at) "
            "VALUES ($1, '{}', 'elsewhere-41-0badc0de', now() - interval '6 seconds'), "
            "($2, $3::jsonb, 'elsewhere-42-0badc0de', now()), "
            "($2 || '@elsewhere-43-0badc0de', $3::jsonb, 'elsewhere-43-0badc0de', now())",
            stale_id,
            fresh_id,
            f'{{"{replica}": 5}}',
        )
        shared: list[None] = []
        with capture_logs() as logs:
            async with (
                gateway(database_url, stale_id, {replica: 1}, shared) as after_a_while,
                gateway(database_url, fresh_id, {replica: 2}, shared) as at_once,
            ):
                await wait_until(
                    lambda: after_a_while.reports >= 1 and at_once.reports >= 1,
                    what="a report each",
                )
                assert after_a_while.reports_as == stale_id
                assert at_once.reports_as == fresh_id
                # The dead lives' requests are counted no more, nor are they silent.
                gateways = await InFlightReports(engine).read_gateways()
                assert gateways.in_flight.get(replica) == 3
                keys = await db.fetch(
                    "SELECT gateway_id, instance FROM gateway_reports "
                    "WHERE gateway_id LIKE $1 || '%' OR gateway_id = $2",
                    fresh_id,
                    stale_id,
                )
                assert {(r["gateway_id"], r["instance"]) for r in keys} == {
                    (stale_id, after_a_while.instance),
                    (fresh_id, at_once.instance),
                }
        assert not shared
        assert not [e for e in logs if e["event"] == "gateway_id_shared"]
        retired = [e for e in logs if e["event"] == "gateway_reports_retired"]
        assert [e["retired"] for e in retired] == [[f"{fresh_id}@elsewhere-43-0badc0de"]]
    finally:
        await db.execute(
            "DELETE FROM gateway_reports WHERE gateway_id = ANY($1::text[])", [stale_id, fresh_id]
        )
        await db.close()


async def test_a_previous_life_still_connected_is_reported_beside_then_retired_when_it_goes(
    engine: AsyncEngine, database_url: str
) -> None:
    """A previous life whose connection is still open (its host vanished without closing
    it, or it is a live twin) is not taken over: the restarted gateway reports beside it.
    Once the connection ends, its row goes with the next report."""
    same_id, replica = f"gw-{secrets.token_hex(4)}", f"r-{secrets.token_hex(4)}"
    token = process_token("elsewhere", 44, "0badc0de")
    previous = await connected_as(database_url, token)
    db = await asyncpg.connect(driver_url(database_url))
    try:
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, instance, reported_at) "
            "VALUES ($1, $2::jsonb, $3, now())",
            same_id,
            f'{{"{replica}": 5}}',
            token,
        )
        async with gateway(database_url, same_id, {replica: 2}, []) as restarted:
            await wait_until(lambda: restarted.reports >= 3, what="three reports")
            assert restarted.reports_as == f"{same_id}@{restarted.instance}"
            read = in_flight_on(InFlightReports(engine), replica)
            assert await read() == 7

            await previous.close()

            async def only_its_own() -> bool:
                return await read() == 2

            await wait_until(only_its_own, what="the previous life's row retired")
            assert (
                await db.fetchval(
                    "SELECT count(*) FROM gateway_reports WHERE gateway_id = $1", same_id
                )
                == 0
            )
    finally:
        if not previous.is_closed():
            await previous.close()
        await db.execute(
            "DELETE FROM gateway_reports WHERE gateway_id = $1 OR gateway_id LIKE $1 || '@%'",
            same_id,
        )
        await db.close()


async def test_a_gateway_killed_and_started_again_on_its_host_takes_its_row_back_at_once(
    engine: AsyncEngine, database_url: str
) -> None:
    """A report written just now by an earlier process on this host that is gone (killed,
    then started again by its supervisor) is taken back at once: left to age, it would
    count as a silent gateway for half a minute and hold every stop of a drained
    replica. So is one whose pid runs another process now, its connection gone. One
    whose connection is open may be a twin: left alone."""
    dead_id, reused_id, live_id = (f"gw-{secrets.token_hex(4)}" for _ in range(3))
    replica = f"r-{secrets.token_hex(4)}"
    finished = subprocess.run(  # noqa: ASYNC221 - a process that is over before the test
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(finished.stdout)  # reaped: no process has it now
    host = socket.gethostname()
    twin_token = process_token(host, os.getppid(), "1badc0de")
    twin_connection = await connected_as(database_url, twin_token)
    db = await asyncpg.connect(driver_url(database_url))
    try:
        await db.execute(
            "INSERT INTO gateway_reports (gateway_id, in_flight, instance, reported_at) "
            "VALUES ($1, '{}', $2, now()), ($3, '{}', $4, now()), ($5, '{}', $6, now())",
            dead_id,
            process_token(host, dead_pid, "0badc0de"),
            reused_id,
            process_token(host, os.getppid(), "0badc0de"),
            live_id,
            twin_token,
        )
        shared: list[None] = []
        async with (
            gateway(database_url, dead_id, {replica: 1}, shared) as restarted,
            gateway(database_url, reused_id, {replica: 1}, shared) as after_reuse,
            gateway(database_url, live_id, {replica: 2}, shared) as twin,
        ):
            await wait_until(
                lambda: min(restarted.reports, after_reuse.reports, twin.reports) >= 3,
                what="three reports each",
            )
            assert restarted.reports_as == dead_id
            assert after_reuse.reports_as == reused_id
            assert twin.reports_as == f"{live_id}@{twin.instance}"
            # Their rows are these processes' now: nothing left under the ids to fall silent.
            holders = await db.fetch(
                "SELECT gateway_id, instance FROM gateway_reports "
                "WHERE gateway_id = ANY($1::text[])",
                [dead_id, reused_id],
            )
            assert {(r["gateway_id"], r["instance"]) for r in holders} == {
                (dead_id, restarted.instance),
                (reused_id, after_reuse.instance),
            }
    finally:
        await twin_connection.close()
        await db.execute(
            "DELETE FROM gateway_reports WHERE gateway_id = ANY($1::text[])",
            [dead_id, reused_id, live_id],
        )
        await db.close()


async def test_a_gateway_of_an_older_release_sharing_the_id_is_noticed(
    engine: AsyncEngine, database_url: str
) -> None:
    same_id, replica = f"gw-{secrets.token_hex(4)}", f"r-{secrets.token_hex(4)}"
    # How a gateway of the release before instance tokens writes: over the row, whoever
    # wrote it, leaving the token as it was.
    older_release_writes = (
        "INSERT INTO gateway_reports (gateway_id, in_flight) VALUES ($1, $2::jsonb) "
        "ON CONFLICT (gateway_id) DO UPDATE "
        "SET in_flight = excluded.in_flight, reported_at = now()"
    )
    db = await asyncpg.connect(driver_url(database_url))
    shared: list[None] = []
    try:
        async with gateway(database_url, same_id, {replica: 2}, shared) as new:
            await wait_until(lambda: new.reports >= 1, what="the new gateway's report")
            await db.execute(older_release_writes, same_id, f'{{"{replica}": 4}}')
            await wait_until(
                lambda: new.reports_as != same_id, what="the new gateway moving to its own key"
            )

            async def noticed() -> bool:
                await db.execute(older_release_writes, same_id, f'{{"{replica}": 4}}')
                return bool(shared)

            await wait_until(noticed, what="the shared id noticed")
            assert await in_flight_on(InFlightReports(engine), replica)() == 6
    finally:
        await db.execute("DELETE FROM gateway_reports WHERE gateway_id = $1", same_id)
        await db.close()
