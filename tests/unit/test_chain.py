"""The chain hash on this side: an event's canonical bytes exactly as docs/audit.md spells
them, and a walk over a log that names the first break and what it is."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.store.chain import (
    GENESIS,
    Break,
    ChainRow,
    ChainWalk,
    Head,
    Problem,
    chain_link,
    event_bytes,
    microseconds,
    parse_anchor,
    relinked,
    stored_row,
)
from app.store.errors import InvalidAnchor

EXAMPLE = ChainRow(
    position=1,
    previous_position=0,
    chain_hash=None,
    stream="node-gpu-1",
    version=1,
    type="node_cordoned",
    schema_version=1,
    event_id=uuid.UUID("00000000-0000-4000-8000-000000000001"),
    recorded_at_us=microseconds(datetime(2026, 3, 2, 9, 0, 0, 123456, tzinfo=UTC)),
    data='{"type": "node_cordoned", "reason": "fan", "node_id": "gpu-1"}',
    meta='{"actor": "alice"}',
    replica_id=None,
    node_id="gpu-1",
    model=None,
    actor="alice",
    correlation_id=None,
)
"""The worked example of docs/audit.md."""
EXAMPLE_BYTES = (
    "01" "0000000000000001" "0000000000000000"
    "0000000a" + b"node-gpu-1".hex() + "0000000000000001"
    "0000000d" + b"node_cordoned".hex() + "0000000000000001"
    "00000000000040008000000000000001"
    "00064c06cfcd6640"
    "0000003e" + EXAMPLE.data.encode().hex()
    + "00000012" + EXAMPLE.meta.encode().hex()
    + "ffffffff" "00000005" + b"gpu-1".hex() + "ffffffff" "00000005" + b"alice".hex() + "ffffffff"
)  # fmt: skip
EXAMPLE_HASH = "981287b92f98e6cf03683ee614d8db2874010c05770c81a457f42caa0e2dacd6"


def test_the_canonical_bytes_of_the_documented_example() -> None:
    assert event_bytes(EXAMPLE).hex() == EXAMPLE_BYTES
    assert chain_link(GENESIS, EXAMPLE).hex() == EXAMPLE_HASH
    assert hashlib.sha256(bytes(32) + bytes.fromhex(EXAMPLE_BYTES)).hexdigest() == EXAMPLE_HASH


def test_the_time_is_whole_microseconds_since_1970_in_utc_whatever_the_zone() -> None:
    in_utc = datetime(2026, 3, 2, 9, 0, 0, 123456, tzinfo=UTC)
    elsewhere = in_utc.astimezone(timezone(timedelta(hours=-7)))

    assert microseconds(elsewhere) == microseconds(in_utc) == EXAMPLE.recorded_at_us
    assert bytes.fromhex("00064c06cfcd6640") == (1772442000123456).to_bytes(8, "big")


def test_an_empty_text_and_a_missing_one_differ() -> None:
    assert event_bytes(EXAMPLE._replace(model="")) != event_bytes(EXAMPLE)


def test_a_stored_time_is_read_exactly_from_postgresqls_binary_form() -> None:
    since_2000 = EXAMPLE.recorded_at_us - 946_684_800_000_000  # timestamptz_send's integer
    sent = [*EXAMPLE[:8], since_2000.to_bytes(8, "big", signed=True), *EXAMPLE[9:]]

    assert stored_row(sent) == EXAMPLE


def chained(count: int, gaps: frozenset[int] = frozenset()) -> list[ChainRow]:
    """A correct log of ``count`` events; positions in ``gaps`` were never used."""
    rows: list[ChainRow] = []
    head, previous, position = GENESIS, 0, 0
    while len(rows) < count:
        position += 1
        if position in gaps:
            continue
        row = EXAMPLE._replace(
            position=position,
            previous_position=previous,
            version=len(rows) + 1,
            event_id=uuid.uuid4(),
            data=f'{{"n": {position}}}',
        )
        head = chain_link(head, row)
        rows.append(row._replace(chain_hash=head))
        previous = position
    return rows


def walk(rows: list[ChainRow], anchors: list[Head] | None = None) -> tuple[ChainWalk, Break | None]:
    chain = ChainWalk(anchors or [])
    for row in rows:
        found = chain.step(row)
        if found is not None:
            return chain, found
    return chain, chain.finish()


def test_a_log_with_gaps_left_by_failed_appends_checks_out() -> None:
    rows = chained(6, gaps=frozenset({3, 4}))

    chain, found = walk(rows)

    assert found is None
    assert chain.events == 6
    assert chain.head == Head(8, rows[-1].chain_hash or b"")


def test_a_changed_event_breaks_at_its_position() -> None:
    rows = chained(5)
    rows[2] = rows[2]._replace(data='{"n": 33}')

    chain, found = walk(rows)

    assert found is not None
    assert (found.position, found.problem) == (3, Problem.CHANGED)
    assert chain.events == 2


def test_a_removed_event_is_missing_at_its_position() -> None:
    rows = chained(5)
    del rows[2]

    _, found = walk(rows)

    assert found is not None
    assert (found.position, found.problem) == (3, Problem.MISSING)


def test_an_event_moved_before_its_predecessor_is_reordered() -> None:
    rows = chained(5)
    rows[1], rows[2] = rows[2]._replace(position=2), rows[1]._replace(position=3)

    _, found = walk(rows)

    assert found is not None
    assert (found.position, found.problem) == (2, Problem.REORDERED)


def test_an_event_inserted_with_a_valid_link_of_its_own_is_found() -> None:
    first, *later = chained(3, gaps=frozenset({2}))  # positions 1, 3 and 4
    forged = first._replace(position=2, previous_position=1, event_id=uuid.uuid4())
    forged = forged._replace(chain_hash=chain_link(first.chain_hash or b"", forged))

    _, found = walk([first, forged, *later])

    assert found is not None
    assert (found.position, found.problem, found.inserted_after) == (2, Problem.INSERTED, 1)


def test_the_event_after_a_gap_that_was_filled_later_hashes_as_its_named_predecessors() -> None:
    first, genuine_next, _ = chained(3, gaps=frozenset({2}))  # positions 1, 3 and 4

    assert relinked(genuine_next, first.chain_hash or b"") is None


def test_an_event_relinked_to_an_earlier_predecessor_is_the_change_not_the_ones_between() -> None:
    rows = chained(5)
    edited = rows[3]._replace(previous_position=2)  # position 4 now names 2; 3 is genuine

    found = relinked(edited, rows[1].chain_hash or b"")

    assert found is not None
    assert (found.position, found.problem) == (4, Problem.CHANGED)
    assert found.detail.startswith(
        "the event at position 4 names position 2 as the one appended before it, but does "
        "not hash as its successor"
    )


def test_inserted_events_are_disowned_back_to_the_event_they_were_inserted_after() -> None:
    first, *later = chained(3, gaps=frozenset({2}))
    forged = first._replace(position=2, previous_position=1, event_id=uuid.uuid4())
    forged = forged._replace(chain_hash=chain_link(first.chain_hash or b"", forged))
    genuine = Head(1, first.chain_hash or b"")
    chain, _ = walk([first, forged, *later], [genuine, Head(2, forged.chain_hash or b"")])

    chain.disown(1, genuine)

    assert (chain.events, chain.head, chain.anchors_passed) == (1, genuine, [genuine])


@pytest.mark.parametrize(
    "damage",
    [
        {"event_id": None},
        {"version": None},
        {"recorded_at_us": None},
        {"previous_position": None},
        {"recorded_at_us": 2**63 - 1 + 946_684_800_000_000},  # infinity, read as stored_row does
    ],
)
def test_a_value_no_appended_event_can_hold_is_a_change_at_its_position(
    damage: dict[str, object],
) -> None:
    rows = chained(4)
    rows[2] = rows[2]._replace(**damage)

    chain, found = walk(rows)

    assert found is not None
    assert (found.position, found.problem) == (3, Problem.CHANGED)
    assert chain.events == 2


def where(rows: list[ChainRow], anchors: list[Head]) -> tuple[int, Problem] | None:
    found = walk(rows, anchors)[1]
    return None if found is None else (found.position, found.problem)


def test_anchors_must_be_passed_at_their_hash() -> None:
    rows = chained(5)
    good = Head(3, rows[2].chain_hash or b"")

    passed, clean = walk(rows, [good, Head(0, GENESIS)])

    assert clean is None
    assert passed.anchors_passed == [Head(0, GENESIS), good]
    assert where(rows, [Head(3, bytes(32))]) == (3, Problem.ANCHOR_MISMATCH)
    assert where(chained(3, gaps=frozenset({2})), [Head(2, bytes(32))]) == (
        2,
        Problem.ANCHOR_MISSING,
    )
    assert where(rows[:4], [Head(5, rows[4].chain_hash or b"")]) == (5, Problem.ANCHOR_BEYOND_END)


@pytest.mark.parametrize(
    "failing", [Head(4, bytes(32)), Head(6, bytes(32))], ids=["mismatch", "missing"]
)
def test_after_an_anchor_that_fails_the_last_good_head_is_the_last_that_held(
    failing: Head,
) -> None:
    rows = chained(6, gaps=frozenset({6}))  # positions 1-5 and 7
    held = Head(2, rows[1].chain_hash or b"")

    chain, found = walk(rows, [held, failing])
    alone, _ = walk(rows, [failing])

    assert found is not None
    assert found.position == failing.position
    assert (chain.head, chain.events, chain.anchors_passed) == (held, 2, [held])
    assert (alone.head, alone.events) == (Head(0, GENESIS), 0)


def test_an_empty_log_passes_through_the_genesis_anchor_only() -> None:
    assert where([], [Head(0, GENESIS)]) is None
    assert where([], [Head(0, bytes([1]) * 32)]) == (0, Problem.ANCHOR_MISMATCH)
    assert where([], [Head(1, GENESIS)]) == (1, Problem.ANCHOR_BEYOND_END)


def test_an_anchor_is_read_as_log_head_prints_it() -> None:
    head = Head(42, bytes(range(32)))

    assert parse_anchor(str(head)) == head
    assert parse_anchor(f" 42:{bytes(range(32)).hex().upper()}\n") == head


@pytest.mark.parametrize(
    "text", ["", "42", "42:", f":{'0' * 64}", f"42:{'0' * 63}", f"4 2:{'0' * 64}",
             f"-1:{'0' * 64}", f"99999999999999999999:{'0' * 64}", f"42:{'z' * 64}"],
)  # fmt: skip
def test_anything_else_is_no_anchor(text: str) -> None:
    with pytest.raises(InvalidAnchor, match="an anchor is POSITION:HASH"):
        parse_anchor(text)
