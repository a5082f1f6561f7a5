"""The live tail of the event log: ``GET /admin/v1/events`` as server-sent events (and as
pages for scripts), and ``llmgw-cli events [--follow] [--since POS]`` reading it."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.admin import events as admin_events
from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, NodeUncordoned, node_stream
from app.store.database import driver_url
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from cli.events import PAGE_SIZE
from cli.sse import SseMessage, SseParser
from tests.support.admin_server import record, seed_node
from tests.support.operator_cli import (
    OPERATOR,
    TOKEN,
    Operator,
    cli_environment,
    installed,
    live_admin_api,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

EVENTS = "/admin/v1/events"
AUTHORIZATION = {"authorization": f"Bearer {TOKEN}"}


@pytest_asyncio.fixture(loop_scope="session")
async def admin_url(pg_store: PostgresEventStore) -> AsyncIterator[str]:
    async with live_admin_api(pg_store) as url:
        yield url


@pytest.fixture
def operator(tmp_path: Path, admin_url: str) -> Operator:
    return Operator(home=tmp_path, admin_url=admin_url)


def a_node() -> str:
    return f"gpu-{secrets.token_hex(3)}"


async def cordon(store: PostgresEventStore, node_id: str, reason: str) -> int:
    await record(store, OPERATOR, NodeCordoned(node_id=node_id, reason=reason))
    return await store.last_position()


class EventStream:
    """Messages of an open event stream, read as the test needs them."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()
        self._parser = SseParser()

    async def comment(self) -> str:
        """The next comment line (the stream opens with one)."""
        async with asyncio.timeout(15):
            async for line in self._lines:
                if line.startswith(":"):
                    return line
        raise AssertionError("the stream ended without a comment")

    async def next(self, count: int = 1) -> list[SseMessage]:
        """The next ``count`` messages (comments are skipped)."""
        found: list[SseMessage] = []
        async with asyncio.timeout(15):
            async for line in self._lines:
                message = self._parser.feed(line)
                if message is not None:
                    found.append(message)
                    if len(found) == count:
                        return found
        raise AssertionError(f"the stream ended after {len(found)} of {count} messages")


async def followers(database_url: str) -> int:
    """LISTEN connections the events stream holds open in the database."""
    connection = await asyncpg.connect(driver_url(database_url))
    try:
        count = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'llmgw-listen-events-%'"
        )
    finally:
        await connection.close()
    assert isinstance(count, int)
    return count


# -- the API -----------------------------------------------------------------------------


async def test_a_stream_resumes_after_since_then_sends_what_is_appended_with_positions_as_ids(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    first = await cordon(pg_store, node, "first")
    second = await cordon(pg_store, node, "second")

    async with (
        httpx.AsyncClient(base_url=admin_url, headers=AUTHORIZATION) as client,
        client.stream("GET", EVENTS, params={"since": first}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = EventStream(response)
        [replayed] = await stream.next()
        third = await cordon(pg_store, node, "third")
        [appended] = await stream.next()

    assert [(m.id, json.loads(m.data)["data"]["reason"]) for m in (replayed, appended)] == [
        (str(second), "second"),
        (str(third), "third"),
    ]
    shown = json.loads(appended.data)
    assert (shown["position"], shown["type"], shown["actor"]) == (third, "node_cordoned", OPERATOR)
    assert shown["stream"] == f"node-{node}"


async def test_last_event_id_wins_over_the_since_of_the_url_a_browser_reconnects_to(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    seen = await cordon(pg_store, node, "seen before the connection broke")
    missed = await cordon(pg_store, node, "appended while disconnected")

    async with (
        httpx.AsyncClient(base_url=admin_url, headers=AUTHORIZATION) as client,
        client.stream(
            "GET", EVENTS, params={"since": 0}, headers={"last-event-id": str(seen)}
        ) as response,
    ):
        [first] = await EventStream(response).next()

    assert first.id == str(missed)


async def test_without_since_a_stream_starts_at_the_end_of_the_log(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    await cordon(pg_store, node, "before")

    async with (
        httpx.AsyncClient(base_url=admin_url, headers=AUTHORIZATION) as client,
        client.stream("GET", EVENTS) as response,
    ):
        stream = EventStream(response)
        # The stream opens with a comment; once it has, its start position is fixed.
        opening = await stream.comment()
        after = await cordon(pg_store, node, "after")
        [first] = await stream.next()

    assert opening == f": following the log after position {after - 1}"
    assert first.id == str(after)


async def test_scripts_read_pages_and_poll_with_next_since(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    positions = [await cordon(pg_store, node, f"n{n}") for n in range(5)]

    async with httpx.AsyncClient(base_url=admin_url, headers=AUTHORIZATION) as client:
        page = await client.get(
            EVENTS, params={"follow": "false", "since": positions[0], "limit": 3}
        )
        rest = await client.get(
            EVENTS, params={"follow": "false", "since": page.json()["next_since"]}
        )
        latest = await client.get(EVENTS, params={"follow": "false", "limit": 2})

    assert page.status_code == 200, page.text
    assert [e["position"] for e in page.json()["events"]] == positions[1:4]
    assert (page.json()["next_since"], page.json()["more"]) == (positions[3], True)
    assert [e["position"] for e in rest.json()["events"]] == positions[4:]
    assert (rest.json()["next_since"], rest.json()["more"]) == (positions[4], False)
    assert [e["data"]["reason"] for e in latest.json()["events"]] == ["n3", "n4"]


async def test_a_position_past_the_end_or_an_unusable_last_event_id_is_refused(
    admin_url: str, pg_store: PostgresEventStore
) -> None:
    await seed_node(pg_store, a_node())
    end = await pg_store.last_position()

    async with httpx.AsyncClient(base_url=admin_url, headers=AUTHORIZATION) as client:
        past = await client.get(EVENTS, params={"since": end + 10})
        garbled = await client.get(EVENTS, headers={"last-event-id": "drain-1"})
        anonymous = await client.get(EVENTS, headers={"authorization": ""})

    assert past.status_code == 400
    assert f"position {end + 10} is past the end of the log" in past.json()["detail"]
    assert garbled.status_code == 400
    assert "Last-Event-ID must be a log position" in garbled.json()["detail"]
    assert [past.json()["title"], garbled.json()["title"]] == ["validation", "validation"]
    assert anonymous.status_code == 401


async def test_a_follower_that_goes_away_leaves_no_database_connection_behind(
    admin_url: str, database_url: str
) -> None:
    async with (
        httpx.AsyncClient(base_url=admin_url, headers=AUTHORIZATION) as client,
        client.stream("GET", EVENTS, params={"since": 0}) as response,
    ):
        assert response.status_code == 200

        async def listening() -> bool:
            return await followers(database_url) == 1

        await wait_until(listening, within_s=10, what="the stream's LISTEN connection")

    async def gone() -> bool:
        return await followers(database_url) == 0

    await wait_until(gone, within_s=10, what="the LISTEN connection closed")


# -- llmgw-cli events --------------------------------------------------------------------


async def test_events_shows_the_latest_events_or_those_after_a_position(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    positions = [await cordon(pg_store, node, f"reason {n}") for n in range(3)]

    table, latest, after = await asyncio.gather(
        operator.run("events"),
        operator.run("events", "--last", "2", "--output", "json"),
        operator.run("events", "--since", str(positions[0]), "--output", "json"),
    )

    assert table.code == 0, table.stderr
    assert "the log: 5 events" in table.stdout
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.stdout.splitlines()]
    last_row = next(row for row in rows if row and row[0] == str(positions[2]))
    assert (last_row[2], last_row[3], last_row[4]) == (
        "node_cordoned",
        OPERATOR,
        f"node {node} cordoned: reason 2",
    )
    assert [e["position"] for e in latest.json()] == positions[1:]
    assert [e["data"]["reason"] for e in after.json()] == ["reason 1", "reason 2"]


async def test_last_more_than_the_log_holds_shows_the_whole_log(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    await cordon(pg_store, node, "the latest")
    length = await pg_store.last_position()

    shown = await operator.run("events", "--last", str(length + 1), "--output", "json")

    assert shown.code == 0, shown.stderr
    assert [e["position"] for e in shown.json()] == list(range(1, length + 1))


async def test_last_more_than_a_page_reads_page_after_page(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    """Beyond what one page of the API holds (``limit`` is at most 5000), too."""
    node = a_node()
    await seed_node(pg_store, node)
    cordons = [NewEvent(NodeCordoned(node_id=node, reason=f"n{n}")) for n in range(PAGE_SIZE)]
    await pg_store.append(node_stream(node), None, cordons, Meta(actor=OPERATOR))
    length = await pg_store.last_position()

    some, all_of_it = await asyncio.gather(
        operator.run("events", "--last", str(PAGE_SIZE + 1), "--output", "json"),
        operator.run("events", "--last", "6000", "--output", "json"),
    )

    assert some.code == 0, some.stderr
    assert [e["position"] for e in some.json()] == list(range(length - PAGE_SIZE, length + 1))
    assert all_of_it.code == 0, all_of_it.stderr
    assert [e["position"] for e in all_of_it.json()] == list(range(1, length + 1))


async def test_follow_prints_an_event_appended_after_it_started_and_resumes_with_since(
    operator: Operator, pg_store: PostgresEventStore, database_url: str
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    start = await pg_store.last_position()
    follower = await operator.start("events", "--follow", "--since", str(start), "--output", "json")
    try:

        async def listening() -> bool:
            return await followers(database_url) == 1

        await wait_until(listening, within_s=20, what="llmgw-cli following the log")
        live = await cordon(pg_store, node, "appended while following")
        printed = await next_json_line(follower)
    finally:
        follower.kill()
        await follower.wait()
    missed = await cordon(pg_store, node, "appended after it stopped")
    resumed = await operator.run("events", "--since", str(printed["position"]), "--output", "json")

    assert (printed["position"], printed["data"]["reason"]) == (live, "appended while following")
    assert [e["position"] for e in resumed.json()] == [missed]


async def next_json_line(process: asyncio.subprocess.Process) -> Any:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 20)
    assert line, "llmgw-cli events --follow printed nothing and ended"
    return json.loads(line)


async def test_follow_resumes_where_it_broke_off_when_the_server_comes_back(
    tmp_path: Path, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    before = await cordon(pg_store, node, "before the restart")
    async with live_admin_api(pg_store) as url:
        port = int(url.rsplit(":", 1)[1])
        operator = Operator(home=tmp_path, admin_url=url)
        follower = await operator.start("events", "--follow", "--last", "1", "--output", "json")
        assert (await next_json_line(follower))["position"] == before
        streamed = await cordon(pg_store, node, "streamed before the restart")
        assert (await next_json_line(follower))["position"] == streamed
    try:
        # Down: the follower retries; meanwhile the log moves on.
        missed = await cordon(pg_store, node, "while the server was down")
        async with live_admin_api(pg_store, port):
            resumed = await next_json_line(follower)
            await record(pg_store, OPERATOR, NodeUncordoned(node_id=node))
            live = await next_json_line(follower)
    finally:
        follower.kill()
        _, stderr = await follower.communicate()

    assert resumed["position"] == missed
    assert live["type"] == "node_uncordoned"
    assert f"resuming after position {streamed}" in stderr.decode()


async def test_follow_prints_one_line_per_event_for_people(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    node = a_node()
    await seed_node(pg_store, node)
    shown = await cordon(pg_store, node, "ECC errors")
    follower = await operator.start("events", "--follow", "--last", "1")
    try:
        assert follower.stdout is not None
        line = await asyncio.wait_for(follower.stdout.readline(), 20)
    finally:
        follower.kill()
        await follower.wait()

    position, _, _, kind, actor, summary = line.decode().split(maxsplit=5)
    assert (position, kind, actor, summary.rstrip()) == (
        str(shown),
        "node_cordoned",
        OPERATOR,
        f"node {node} cordoned: ECC errors",
    )


async def test_a_reader_gone_before_a_listing_is_written_ends_it_quietly_with_141(
    operator: Operator, pg_store: PostgresEventStore
) -> None:
    """``llmgw-cli events | head -1`` and the like, as tables and as JSON: the exit code
    ``events --follow`` ends with, and no traceback."""
    node = a_node()
    await seed_node(pg_store, node)
    await cordon(pg_store, node, "listed to nobody")
    environment = cli_environment(operator.home, operator.settings())
    commands = [
        ("events",),
        ("events", "--output", "json"),
        ("history", "node", node),
        ("history", "node", node, "--output", "json"),
        ("keys", "list"),
        ("nodes",),
    ]

    async def unread(*args: str) -> tuple[int, str]:
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            process = await asyncio.create_subprocess_exec(
                installed("llmgw-cli"),
                *args,
                env=environment,
                stdout=write_end,
                stderr=asyncio.subprocess.PIPE,
            )
        finally:
            os.close(write_end)
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode is not None
        return process.returncode, stderr.decode()

    ended = [await unread(*command) for command in commands]

    assert ended == [(141, "")] * len(commands)


async def test_follow_stops_when_its_reader_goes_away_on_a_log_that_stays_quiet(
    operator: Operator, pg_store: PostgresEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``events --follow | head -1`` where nothing more is recorded: it ended only with the
    next event printed to nobody, on a quiet cluster never. The server's keepalives are what
    it reads meanwhile (every 15 s; shortened here)."""
    monkeypatch.setattr(admin_events, "KEEPALIVE_S", 0.2)
    node = a_node()
    await seed_node(pg_store, node)
    await cordon(pg_store, node, "the one line read")
    environment = cli_environment(operator.home, operator.settings())
    command = [installed("llmgw-cli"), "events", "--follow", "--last", "1", "--output", "json"]
    read_end, write_end = os.pipe()
    piped = await asyncio.create_subprocess_exec(
        *command, env=environment, stdout=write_end, stderr=asyncio.subprocess.PIPE
    )
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as reader:
            assert json.loads(await asyncio.to_thread(reader.readline))["data"]["reason"]
        _, stderr = await asyncio.wait_for(piped.communicate(), 30)
    finally:
        if piped.returncode is None:
            piped.kill()
            await piped.wait()

    assert (piped.returncode, stderr.decode()) == (141, "")


async def test_follow_stops_quietly_on_ctrl_c(
    operator: Operator, pg_store: PostgresEventStore, database_url: str
) -> None:
    """Ctrl-C while following: the documented exit code, no traceback. (A reader that goes
    away: ``test_follow_stops_when_its_reader_goes_away_on_a_log_that_stays_quiet``.)"""
    node = a_node()
    await seed_node(pg_store, node)
    await cordon(pg_store, node, "shown first")
    environment = cli_environment(operator.home, operator.settings())
    command = [installed("llmgw-cli"), "events", "--follow", "--last", "1", "--output", "json"]
    interrupted = await asyncio.create_subprocess_exec(
        *command, env=environment, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:

        async def listening() -> bool:
            return await followers(database_url) == 1

        await wait_until(listening, within_s=30, what="the follower listening")
        interrupted.send_signal(signal.SIGINT)
        await cordon(pg_store, node, "printed to nobody")
        _, interrupted_stderr = await asyncio.wait_for(interrupted.communicate(), 30)
    finally:
        if interrupted.returncode is None:
            interrupted.kill()
            await interrupted.wait()

    assert (interrupted.returncode, interrupted_stderr.decode()) == (130, "")
