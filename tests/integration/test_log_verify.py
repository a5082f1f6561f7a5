"""``llmgw-server log verify`` and ``log head`` as an auditor runs them, against a log that
someone with the superuser's password changed around the database's guards: each change is
found at the position where it was made, and one recomputed all the way to the end is
found against a head recorded before.

Verification runs as the runtime role (it only reads); the tampering as the superuser,
with the triggers silenced by ``session_replication_role``.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from app.domain.envelope import Meta
from app.domain.events import (
    NodeCordoned,
    NodeRegistered,
    ReplicaPlaced,
    ShardPlacement,
    node_stream,
    replica_stream,
)
from app.store.chain import GENESIS
from app.store.database import driver_url
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.cluster import SERVER
from tests.support.databases import runtime_url
from tests.support.postgres import PostgresServer, quote_identifier, unique_database_name

EVENTS = 12
PROCESS_TIMEOUT_S = 60


REHASH_FROM = """DO $$
    DECLARE
        e record;
        previous bytea := (SELECT chain_hash FROM events WHERE position < {at}
                           ORDER BY position DESC LIMIT 1);
    BEGIN
        FOR e IN SELECT * FROM events WHERE position >= {at} ORDER BY position LOOP
            previous := sha256(previous || llmgw_event_bytes(e.position,
                e.previous_position, e.stream, e.version, e.type, e.schema_version,
                e.event_id, e.recorded_at, e.data, e.meta, e.replica_id, e.node_id,
                e.model, e.actor, e.correlation_id));
            UPDATE events SET chain_hash = previous WHERE position = e.position;
        END LOOP;
    END $$"""
"""Every chain hash from position ``at`` to the end recomputed, as someone who can rewrite
the whole table would after changing an event there."""


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Log:
    """The test's log: ``EVENTS`` events at positions ``first`` .. ``first + EVENTS - 1``."""

    database_url: str
    first: int

    async def run(self, *args: str) -> Result:
        done = await asyncio.to_thread(
            subprocess.run,
            [SERVER, "log", *args, "--database-url", runtime_url(self.database_url)],
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    async def run_unread(self, *args: str) -> Result:
        """``llmgw-server log ARGS | head -0``: its stdout a pipe whose reader has gone."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                [SERVER, "log", *args, "--database-url", runtime_url(self.database_url)],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=PROCESS_TIMEOUT_S,
                check=False,
            )
        finally:
            os.close(write_end)
        return Result(done.returncode, "", done.stderr)

    async def head(self) -> str:
        result = await self.run("head")
        assert result.code == 0, result
        return result.stdout.strip()

    async def anchor_at(self, position: int) -> str:
        """``POSITION:HASH`` of the event at ``position``, as ``log head`` printed it then."""
        connection = await asyncpg.connect(driver_url(self.database_url))
        try:
            chain_hash = await connection.fetchval(
                "SELECT chain_hash FROM events WHERE position = $1", position
            )
        finally:
            await connection.close()
        return f"{position}:{bytes(chain_hash).hex()}"

    async def leave_a_gap(self) -> int:
        """Take a position that no event gets, as an append that failed does."""
        connection = await asyncpg.connect(driver_url(self.database_url))
        try:
            return int(
                await connection.fetchval(
                    "SELECT nextval(pg_get_serial_sequence('events', 'position'))"
                )
            )
        finally:
            await connection.close()

    async def tamper(self, *statements: str) -> None:
        """Run ``statements`` as the superuser, with the log's triggers off."""
        connection = await asyncpg.connect(driver_url(self.database_url))
        try:
            async with connection.transaction():
                await connection.execute("SET LOCAL session_replication_role = replica")
                for statement in statements:
                    await connection.execute(statement)
        finally:
            await connection.close()


async def seed(store: PostgresEventStore) -> int:
    """Events of several kinds, with and without the optional columns; the first position."""
    node, replica = f"gpu-{uuid.uuid4().hex[:6]}", f"m-{uuid.uuid4().hex[:4]}-1"
    shard = ShardPlacement(index=0, node_id=node, gpus=(0,), port=20001)
    first = (await store.last_position()) + 1
    await store.append(
        node_stream(node),
        None,
        [NewEvent(NodeRegistered(node_id=node, address="h"))],
        Meta(actor="a"),
    )
    for n in range(EVENTS - 2):
        reason = f'step {n}: ünïcode € 🚀 and "quotes" \\ and a tab\t'
        meta = Meta(actor=f"alice-{n}", correlation_id=f"drain-{n}" if n % 2 else None)
        await store.append(
            node_stream(node), None, [NewEvent(NodeCordoned(node_id=node, reason=reason))], meta
        )
    placed = ReplicaPlaced(replica_id=replica, model=replica[:-2], number=1, shards=(shard,))
    await store.append(replica_stream(replica), None, [NewEvent(placed)], Meta(actor="reconciler"))
    return first


@pytest_asyncio.fixture(loop_scope="session")
async def log(database_url: str, pg_store: PostgresEventStore) -> AsyncIterator[Log]:
    yield Log(database_url, await seed(pg_store))


def breaks(result: Result) -> str:
    assert result.code == 1, result
    return result.stdout.splitlines()[0]


async def test_an_untouched_log_verifies_and_its_head_is_the_last_event(log: Log) -> None:
    last = log.first + EVENTS - 1

    verified = await log.run("verify")
    as_json = await log.run("verify", "--output", "json")
    head = await log.head()

    assert verified.code == 0, verified
    assert verified.stdout.splitlines() == [
        f"log verified: {EVENTS} events, the chain holds up to position {last}",
        f"head {head}",
    ]
    assert verified.stderr == ""
    assert head.startswith(f"{last}:")
    report = json.loads(as_json.stdout)
    assert report["ok"] is True
    assert report["break"] is None
    assert f"{report['head']['position']}:{report['head']['chain_hash']}" == head
    head_json = json.loads((await log.run("head", "--output", "json")).stdout)
    assert head_json == report["head"]


async def test_a_reader_that_goes_away_ends_verify_and_head_quietly_with_141(log: Log) -> None:
    """``llmgw-server log verify | head -1``: as ``git log | head`` ends, no traceback."""
    commands = [
        ("verify",),
        ("verify", "--output", "json"),
        ("head",),
        ("head", "--output", "json"),
    ]

    ended = [await log.run_unread(*command) for command in commands]

    assert [(r.code, r.stderr) for r in ended] == [(141, "")] * len(commands)


async def test_an_empty_log_has_the_genesis_as_its_head(database_url: str) -> None:
    empty = Log(database_url, 1)

    verified = await empty.run("verify", "--anchor", f"0:{GENESIS.hex()}")

    assert verified.code == 0, verified
    assert await empty.head() == f"0:{'00' * 32}"


async def test_an_edited_payload_is_found_at_its_position(log: Log) -> None:
    edited = log.first + 4
    await log.tamper(
        f"UPDATE events SET data = jsonb_set(data, '{{reason}}', '\"nothing to see\"') "
        f"WHERE position = {edited}"
    )

    result = await log.run("verify")

    assert breaks(result) == (
        f"the chain breaks at position {edited} (changed): the event at position {edited} "
        "does not match its chain hash: its payload or another column was changed after it "
        "was appended (or the chain hash of the event before it was)"
    )
    assert result.stdout.splitlines()[1] == "4 events before it checked out"


async def test_an_edited_actor_column_is_found_too(log: Log) -> None:
    await log.tamper(f"UPDATE events SET actor = 'someone else' WHERE position = {log.first + 7}")

    assert f"position {log.first + 7} (changed)" in breaks(await log.run("verify"))


@pytest.mark.parametrize(
    "edits",
    [
        ["UPDATE events SET recorded_at = '12026-03-02 09:00:00+00' WHERE position = {at}"],
        ["UPDATE events SET recorded_at = 'infinity' WHERE position = {at}"],
        [
            "ALTER TABLE events ALTER COLUMN event_id DROP NOT NULL",
            "UPDATE events SET event_id = NULL WHERE position = {at}",
        ],
        [
            "ALTER TABLE events ALTER COLUMN version DROP NOT NULL",
            "UPDATE events SET version = NULL WHERE position = {at}",
        ],
    ],
    ids=["time-beyond-year-9999", "time-infinity", "null-event-id", "null-version"],
)
async def test_a_value_no_event_can_hold_is_found_changed_at_its_position(
    log: Log, edits: list[str]
) -> None:
    edited = log.first + 5
    await log.tamper(*(edit.format(at=edited) for edit in edits))

    result = await log.run("verify")

    assert f"the chain breaks at position {edited} (changed)" in breaks(result)
    assert result.stdout.splitlines()[1] == "5 events before it checked out"
    assert result.stderr == ""


async def test_a_deleted_event_is_found_missing_at_its_position(log: Log) -> None:
    deleted = log.first + 6
    await log.tamper(f"DELETE FROM events WHERE position = {deleted}")

    line = breaks(await log.run("verify"))

    assert line.startswith(
        f"the chain breaks at position {deleted} (missing): the event at position {deleted} "
        f"is missing: position {deleted + 1} was appended right after it"
    ), line


async def test_a_swapped_pair_is_found_reordered_at_the_first_of_them(log: Log) -> None:
    first, second = log.first + 2, log.first + 3
    await log.tamper(
        "ALTER TABLE events DROP CONSTRAINT events_previous_position_check",
        f"CREATE TEMP TABLE pair AS SELECT * FROM events WHERE position IN ({first}, {second})",
        f"DELETE FROM events WHERE position IN ({first}, {second})",
        f"UPDATE pair SET position = CASE position WHEN {first} THEN {second} ELSE {first} END",
        "INSERT INTO events OVERRIDING SYSTEM VALUE SELECT * FROM pair",
    )

    line = breaks(await log.run("verify"))

    assert line == (
        f"the chain breaks at position {first} (reordered): the event at position {first} was "
        f"appended after position {first}, which is not before it: events were moved"
    )


async def test_events_inserted_into_a_gap_are_found_and_none_of_them_checks_out(
    log: Log, pg_store: PostgresEventStore
) -> None:
    genuine_head = await log.head()
    gap = await log.leave_a_gap()
    await pg_store.append(
        node_stream(f"gpu-{uuid.uuid4().hex[:6]}"),
        None,
        [NewEvent(NodeRegistered(node_id="later", address="h"))],
        Meta(actor="a"),
    )
    before = gap - 1
    await log.tamper(
        # A forged event in the gap, linked and hashed as llmgw_append would have done it.
        f"""INSERT INTO events (position, previous_position, chain_hash, stream, version, type,
                                schema_version, data, meta, event_id, recorded_at, actor)
        OVERRIDING SYSTEM VALUE
        SELECT {gap}, {before}, sha256(chain_hash || llmgw_event_bytes({gap}, {before},
                   'key-forged', 1, 'api_key_created', 1::smallint,
                   '00000000-0000-4000-8000-0000000000ff', recorded_at, '{{}}', '{{}}',
                   NULL, NULL, NULL, 'alice', NULL)),
               'key-forged', 1, 'api_key_created', 1, '{{}}', '{{}}',
               '00000000-0000-4000-8000-0000000000ff', recorded_at, 'alice'
        FROM events WHERE position = {before}"""
    )

    text = await log.run("verify")
    as_json = json.loads((await log.run("verify", "--output", "json")).stdout)

    assert text.code == 1, text
    assert text.stdout.splitlines()[:3] == [
        f"the chain breaks at position {gap} (inserted): events were inserted after position "
        f"{before}: position {gap + 1} was appended right after it, but now position {gap} "
        "(and any between) stands between them",
        f"{EVENTS} events before it checked out",
        f"last good head {genuine_head}",
    ]
    assert (as_json["events"], as_json["break"]["position"]) == (EVENTS, gap)
    assert f"{as_json['head']['position']}:{as_json['head']['chain_hash']}" == genuine_head


async def test_an_edited_previous_position_is_found_changed_not_the_event_before_inserted(
    log: Log,
) -> None:
    edited = log.first + 6
    await log.tamper(
        f"UPDATE events SET previous_position = {edited - 2} WHERE position = {edited}"
    )

    result = await log.run("verify")

    assert breaks(result) == (
        f"the chain breaks at position {edited} (changed): the event at position {edited} "
        f"names position {edited - 2} as the one appended before it, but does not hash as "
        "its successor: its previous position or another column was changed after it was "
        "appended, or it was added later with a link taken from another event"
    )
    assert result.stdout.splitlines()[1] == "6 events before it checked out"


async def test_a_row_added_with_the_last_events_link_is_found_changed_at_its_own_position(
    log: Log,
) -> None:
    genuine_head = await log.head()
    last = log.first + EVENTS - 1
    added = last + 100
    await log.tamper(
        f"""INSERT INTO events OVERRIDING SYSTEM VALUE
        SELECT {added}, stream || '-forged', version, type, schema_version, data, meta,
               gen_random_uuid(), recorded_at, replica_id, node_id, model, actor,
               correlation_id, previous_position, chain_hash
        FROM events WHERE position = {last}"""
    )

    result = await log.run("verify")

    assert breaks(result).startswith(
        f"the chain breaks at position {added} (changed): the event at position {added} "
        f"names position {last - 1} as the one appended before it"
    ), result
    assert result.stdout.splitlines()[1:3] == [
        f"{EVENTS} events before it checked out",
        f"last good head {genuine_head}",
    ]


@pytest.mark.parametrize("named", ["-7", "{gap}"], ids=["negative", "a-gap"])
async def test_a_predecessor_no_event_holds_is_found_missing_not_a_crash(
    log: Log, pg_store: PostgresEventStore, named: str
) -> None:
    gap = await log.leave_a_gap()
    for _ in range(2):
        await pg_store.append(
            node_stream(f"gpu-{uuid.uuid4().hex[:6]}"),
            None,
            [NewEvent(NodeRegistered(node_id="later", address="h"))],
            Meta(actor="a"),
        )
    last = gap + 2
    before = named.format(gap=gap)
    await log.tamper(f"UPDATE events SET previous_position = {before} WHERE position = {last}")

    result = await log.run("verify")

    assert breaks(result).startswith(
        f"the chain breaks at position {before} (missing): the event at position {before} is "
        f"missing: position {last} was appended right after it"
    ), result
    assert result.stdout.splitlines()[1] == f"{EVENTS + 1} events before it checked out"
    assert result.stderr == ""


async def test_an_anchor_the_chain_does_not_pass_through_is_reported(log: Log) -> None:
    head = await log.head()
    position, chain_hash = head.split(":")
    other = f"{position}:{'ab' * 32}"

    matching = await log.run("verify", "--anchor", head)
    mismatch = await log.run("verify", "--anchor", other, "--output", "json")

    assert matching.code == 0, matching
    assert f"passes through anchor {head}" in matching.stdout.splitlines()
    assert mismatch.code == 1, mismatch
    report = json.loads(mismatch.stdout)["break"]
    assert report["position"] == int(position)
    assert report["problem"] == "anchor_mismatch"
    assert f"is {chain_hash}, not the anchor's {'ab' * 32}" in report["detail"]


async def test_a_log_rewritten_and_rehashed_to_its_end_fails_only_against_an_older_head(
    log: Log,
) -> None:
    recorded = await log.head()
    rewritten = log.first + 1
    await log.tamper(
        f"UPDATE events SET data = jsonb_set(data, '{{reason}}', '\"forged\"') "
        f"WHERE position = {rewritten}",
        REHASH_FROM.format(at=rewritten),
    )

    alone = await log.run("verify")
    anchored = await log.run("verify", "--anchor", recorded)

    assert alone.code == 0, alone
    assert await log.head() != recorded
    assert breaks(anchored).startswith(
        f"the chain breaks at position {recorded.split(':')[0]} (anchor_mismatch)"
    )


async def test_events_removed_from_the_end_are_found_against_an_older_head(log: Log) -> None:
    recorded = await log.head()
    last = int(recorded.split(":")[0])
    await log.tamper(f"DELETE FROM events WHERE position > {last - 2}")

    alone = await log.run("verify")
    anchored = await log.run("verify", "--anchor", recorded)

    assert alone.code == 0, alone
    assert breaks(anchored) == (
        f"the chain breaks at position {last} (anchor_beyond_end): the log ends at position "
        f"{last - 2}, before the anchor at position {last}: events at the end were removed, "
        "or the anchor is of another database"
    )


@pytest.mark.parametrize("output", ["text", "json"])
async def test_a_last_event_without_a_chain_hash_has_no_head_to_record(
    log: Log, output: str
) -> None:
    last = log.first + EVENTS - 1
    await log.tamper(
        "ALTER TABLE events ALTER COLUMN chain_hash DROP NOT NULL",
        f"UPDATE events SET chain_hash = NULL WHERE position = {last}",
    )

    head = await log.run("head", "--output", output)
    verified = await log.run("verify")

    assert head.code == 1, head  # broken, as `log verify` says it: not unreadable (3)
    assert head.stdout == ""  # nothing a script could append to its heads
    assert head.stderr.splitlines() == [
        "llmgw-server log head: "
        f"the last event, at position {last}, has no chain hash: the chain is broken "
        "there, so there is no head to record (`llmgw-server log verify` finds where it "
        "breaks first)"
    ], head.stderr
    assert breaks(verified).startswith(f"the chain breaks at position {last} (changed)")


async def test_a_last_event_whose_chain_hash_is_no_sha256_has_no_head_to_record(log: Log) -> None:
    # Its head was printed ("12:00", exit 0), and no `log verify --anchor` could take it back.
    last = log.first + EVENTS - 1
    await log.tamper(
        "ALTER TABLE events DROP CONSTRAINT events_chain_hash_check",
        f"UPDATE events SET chain_hash = '\\x00'::bytea WHERE position = {last}",
    )

    head = await log.run("head")
    verified = await log.run("verify")

    assert head.code == 1, head
    assert head.stdout == ""
    assert head.stderr.splitlines() == [
        "llmgw-server log head: "
        f"the last event, at position {last}, has a chain hash of 1 byte, not 32: the "
        "chain is broken there, so there is no head to record (`llmgw-server log verify` "
        "finds where it breaks first)"
    ], head.stderr
    assert breaks(verified).startswith(f"the chain breaks at position {last} (changed)")


@pytest.mark.parametrize(
    "anchor", ["12", "12:abc", f"x:{'0' * 64}", f"-1:{'0' * 64}", f"12:{'g' * 64}"]
)
async def test_a_malformed_anchor_is_refused_in_one_line(log: Log, anchor: str) -> None:
    result = await log.run("verify", "--anchor", anchor)

    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(
        "llmgw-server log verify: --anchor: an anchor is POSITION:HASH"
    ), result
    assert len(result.stderr.splitlines()) == 1


@pytest_asyncio.fixture(loop_scope="session")
async def unmigrated_url(
    postgres_server: PostgresServer, migrated_template: str
) -> AsyncIterator[str]:
    """A database never migrated, on a server where the test runtime role exists (it is
    set up with the migrated template): its own test alone would otherwise meet no such
    role rather than no log."""
    name = unique_database_name("llmgw_unmigrated")
    await postgres_server.create_database(name)
    yield postgres_server.url(name)
    await postgres_server.drop_database(name)


@pytest.mark.parametrize("command", ["verify", "head"])
async def test_a_database_without_the_log_is_refused_in_one_line(
    unmigrated_url: str, command: str
) -> None:
    result = await Log(unmigrated_url, 1).run(command)

    # Not 3 any more, which is a database that did not answer: a log that is not there,
    # as for `projections rebuild`; and not "the log does not check out" (1).
    assert result.code == 5, result
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"llmgw-server log {command}: "
        f"cannot {'verify' if command == 'verify' else 'read the head of'} the log: "
        'relation "events" does not exist (is the database at the newest revision? '
        "llmgw-server migrate)"
    ], result.stderr


@pytest.mark.parametrize("command", ["verify", "head"])
async def test_a_role_that_does_not_exist_is_told_so_and_how_roles_are_made(
    database_url: str, command: str
) -> None:
    # Before, PostgreSQL's "does not exist" was taken for the schema's, and the auditor
    # was told to migrate a database that is migrated.
    role = f"llmgw_auditor_{uuid.uuid4().hex[:8]}"
    url = make_url(database_url).set(username=role, password=None)

    done = await asyncio.to_thread(
        subprocess.run,
        [SERVER, "log", command, "--database-url", url.render_as_string(hide_password=False)],
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )

    # A refused role, as for `projections rebuild`: not 3, which is a database that did
    # not answer; and not "the log does not check out" (1).
    assert done.returncode == 4, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"llmgw-server log {command}: "
        f"cannot {'verify' if command == 'verify' else 'read the head of'} the log: "
        f'the role "{role}" of --database-url (LLMGW_DATABASE_URL) does not exist on this '
        "PostgreSQL server; connect as a role that may read the log (the runtime role may): "
        "the server's administrator creates roles (createuser, or CREATE ROLE), and "
        "`llmgw-server migrate --runtime-role llmgw_runtime` creates the runtime role where "
        "the owner may create roles (docs/operations.md, PostgreSQL)"
    ], done.stderr


@pytest.mark.parametrize("command", ["verify", "head"])
async def test_a_role_that_may_not_read_the_log_is_a_refused_role(
    postgres_server: PostgresServer, database_url: str, command: str
) -> None:
    role = f"llmgw_auditor_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_server.admin_url)
    try:
        await admin.execute(f"CREATE ROLE {quote_identifier(role)} LOGIN")
        url = make_url(database_url).set(username=role, password=None)
        done = await asyncio.to_thread(
            subprocess.run,
            [SERVER, "log", command, "--database-url", url.render_as_string(hide_password=False)],
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
            check=False,
        )
    finally:
        await admin.execute(f"DROP ROLE {quote_identifier(role)}")
        await admin.close()

    assert done.returncode == 4, done  # as `projections rebuild` says of a refused role
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"llmgw-server log {command}: "
        f"cannot {'verify' if command == 'verify' else 'read the head of'} the log: "
        "permission denied for table events"
    ], done.stderr


@pytest.mark.parametrize("command", ["verify", "head"])
async def test_a_database_that_does_not_exist_is_not_a_broken_log(
    postgres_server: PostgresServer, migrated_template: str, command: str
) -> None:
    # The migrated template sets up the runtime role the command connects as, which
    # PostgreSQL would refuse before it looked for the database.
    missing = unique_database_name("llmgw_missing")

    result = await Log(postgres_server.url(missing), 1).run(command)

    assert result.code == 5, result  # not 3: a database that answered, without that database
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"llmgw-server log {command}: "
        f"cannot {'verify' if command == 'verify' else 'read the head of'} the log: "
        f'database error: database "{missing}" does not exist (check the database name of '
        "--database-url, LLMGW_DATABASE_URL)"
    ], result.stderr


@pytest.mark.parametrize("command", ["verify", "head"])
async def test_a_malformed_database_url_is_refused_in_one_line(command: str) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [SERVER, "log", command, "--database-url", "postgresql://llmgw:hunter2@db-a:5432,,db-b/x"],
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
        check=False,
    )

    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        f"llmgw-server log {command}: --database-url: the database URL "
        "'postgresql://llmgw:***@db-a:5432,,db-b/x' has an empty host in its list of hosts"
    ], done.stderr


async def test_an_unreachable_database_is_not_reported_as_a_broken_log() -> None:
    """A check from cron tells "the log was tampered with" (1) from "the log could not be
    read" (3)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        done = await asyncio.to_thread(
            subprocess.run,
            [SERVER, "log", "verify", "--database-url", f"postgresql://llmgw@127.0.0.1:{port}/x"],
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
            check=False,
        )

    assert done.returncode == 3, done
    assert done.stdout == ""
    assert done.stderr.startswith(
        "llmgw-server log verify: cannot verify the log: database unreachable"
    ), done


async def test_on_a_terminal_it_shows_how_far_it_got(log: Log) -> None:
    terminal, its_side = pty.openpty()
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [SERVER, "log", "verify", "--database-url", runtime_url(log.database_url)],
            stdout=subprocess.PIPE,
            stderr=its_side,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
            check=False,
        )
        shown = os.read(terminal, 65536).decode()
    finally:
        os.close(its_side)
        os.close(terminal)

    last = log.first + EVENTS - 1
    assert done.returncode == 0
    assert f"\rverifying: {EVENTS} events, at position {last} (100%)" in shown
    assert shown.endswith("\r\x1b[K")  # and the line is cleared before the report
    assert done.stdout.startswith(f"log verified: {EVENTS} events")


async def test_after_a_rewritten_anchor_the_last_good_head_is_the_last_anchor_that_held(
    log: Log,
) -> None:
    """The rehashed events check out against their own hashes, but the anchor shows they
    were rewritten: what is left to trust is the older anchor, not the rewritten head."""
    older = await log.anchor_at(log.first + 2)
    recorded = await log.head()
    await log.tamper(
        f"UPDATE events SET data = jsonb_set(data, '{{reason}}', '\"forged\"') "
        f"WHERE position = {log.first + 5}",
        REHASH_FROM.format(at=log.first + 5),
    )

    anchored = await log.run("verify", "--anchor", older, "--anchor", recorded)

    assert breaks(anchored).startswith(
        f"the chain breaks at position {recorded.split(':')[0]} (anchor_mismatch)"
    )
    assert anchored.stdout.splitlines()[1:4] == [
        f"{log.first + 2} events before it checked out",  # no gap before the anchor
        f"last good head {older}",
        f"passes through anchor {older}",
    ]
