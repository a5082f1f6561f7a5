"""The event log's chain hash, checked on this side of the connection.

Every event carries ``chain_hash = sha256(previous chain hash || canonical bytes)``, the
first event's previous chain hash being ``GENESIS``. ``llmgw_append`` computes it under the
append lock (migration 0005, ``llmgw_event_bytes``); ``event_bytes`` here builds the same
bytes from the stored columns, so that verifying the log trusts no function in the
database. docs/audit.md defines the bytes for anyone who wants to check them elsewhere.

``ChainWalk`` takes the events in position order, one at a time (memory stays constant
however long the log), and names the first place where the chain breaks and how: an event
changed, missing, inserted or moved. It also checks the chain against anchors: heads
recorded earlier, outside the database, which someone able to rewrite the whole table and
recompute every hash cannot match.
"""

from __future__ import annotations

import hashlib
import re
import struct
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

import msgspec

from app.store.errors import InvalidAnchor

GENESIS = bytes(32)
"""The chain hash "before" the first event: 32 zero bytes."""
FORMAT_VERSION = 1
"""The first byte of every event's canonical bytes."""

CHAIN_COLUMNS = (
    "position, previous_position, chain_hash, stream, version, type, schema_version, "
    "event_id, pg_catalog.timestamptz_send(recorded_at), data::text, meta::text, replica_id, "
    "node_id, model, actor, correlation_id"
)
"""What to select for ``stored_row``, in ``ChainRow``'s order. The time comes as PostgreSQL's
binary form of it (microseconds since 2000-01-01 UTC, a signed 8-byte integer), so that any
stored value is read exactly, even one no ``datetime`` can hold (``infinity``, year 10000)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_Y2K_SINCE_1970_US = 946_684_800_000_000
_INT8_MIN, _INT8_MAX = -(2**63), 2**63 - 1
_NULL = struct.pack(">i", -1)
_HEADER = struct.Struct(">Bqq")
_INT8 = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
_ANCHOR = re.compile(r"(\d{1,19}):([0-9a-fA-F]{64})")


class ChainRow(NamedTuple):
    """One event's stored columns, as ``stored_row`` reads them. The columns that every
    appended event has may still be NULL here: someone can drop the constraint and empty
    them, and the walk reports that rather than failing on it."""

    position: int
    previous_position: int | None
    chain_hash: bytes | None
    stream: str
    version: int | None
    type: str
    schema_version: int | None
    event_id: uuid.UUID | None
    recorded_at_us: int | None
    """Microseconds since 1970-01-01 UTC (``microseconds``)."""
    data: str
    meta: str
    replica_id: str | None
    node_id: str | None
    model: str | None
    actor: str
    correlation_id: str | None


def microseconds(at: datetime) -> int:
    """``at`` as the canonical bytes count time: whole microseconds since 1970 in UTC."""
    return (at - _EPOCH) // _MICROSECOND


def stored_row(values: Sequence[Any]) -> ChainRow:
    """A row as ``CHAIN_COLUMNS`` selects it."""
    sent = values[8]
    time = None if sent is None else int.from_bytes(sent, signed=True) + _Y2K_SINCE_1970_US
    return ChainRow._make((*values[:8], time, *values[9:]))


def unchainable(row: ChainRow) -> str | None:
    """Why ``row`` cannot be an appended event whatever its hash, or None: a column every
    event has is empty, or its time is one ``llmgw_append`` could not have hashed."""
    if row.chain_hash is None:
        return "has no chain_hash"
    return _unhashable(row)


def _unhashable(row: ChainRow) -> str | None:
    # Plain tests first: this runs for every event of the log, twice.
    if (
        row.previous_position is None
        or row.version is None
        or row.schema_version is None
        or row.event_id is None
        or row.recorded_at_us is None
    ):
        empty = [name for name in _HASHED_REQUIRED if getattr(row, name) is None]
        return f"has no {', '.join(empty)}"
    if not _INT8_MIN <= row.recorded_at_us <= _INT8_MAX:
        return "has a time no event can have"
    return None


_HASHED_REQUIRED = ("previous_position", "version", "schema_version", "event_id", "recorded_at_us")


def event_bytes(row: ChainRow) -> bytes:
    """The canonical bytes of one event (``llmgw_event_bytes`` in SQL); raises
    ``ValueError`` when a column they hold is empty or out of range (``unchainable``)."""
    problem = _unhashable(row)
    if problem is not None or row.event_id is None:
        raise ValueError(f"the event at position {row.position} {problem}")
    return b"".join(
        (
            _HEADER.pack(FORMAT_VERSION, row.position, row.previous_position),
            _text(row.stream),
            _INT8.pack(row.version),
            _text(row.type),
            _INT8.pack(row.schema_version),
            row.event_id.bytes,
            _INT8.pack(row.recorded_at_us),
            _text(row.data),
            _text(row.meta),
            _text(row.replica_id),
            _text(row.node_id),
            _text(row.model),
            _text(row.actor),
            _text(row.correlation_id),
        )
    )


def chain_link(previous_hash: bytes, row: ChainRow) -> bytes:
    return hashlib.sha256(previous_hash + event_bytes(row)).digest()


def _text(value: str | None) -> bytes:
    if value is None:
        return _NULL
    raw = value.encode()
    return _LENGTH.pack(len(raw)) + raw


class Problem(StrEnum):
    CHANGED = "changed"
    MISSING = "missing"
    INSERTED = "inserted"
    REORDERED = "reordered"
    ANCHOR_MISMATCH = "anchor_mismatch"
    ANCHOR_MISSING = "anchor_missing"
    ANCHOR_BEYOND_END = "anchor_beyond_end"


class Break(msgspec.Struct, frozen=True):
    """Where the chain first breaks, and what is wrong there."""

    position: int
    problem: Problem
    detail: str
    inserted_after: int | None = None
    """For ``INSERTED``: the position the next genuine event was appended after (the first
    inserted event is the one that now follows it)."""
    appended_next: int | None = None
    """For ``INSERTED``: that next genuine event's position."""


def missing_predecessor(named: int, inserted: Break) -> Break:
    """An ``INSERTED`` break whose named predecessor no event holds (the walk cannot know:
    it keeps no positions): that event is missing, not the ones after it inserted."""
    return Break(
        named,
        Problem.MISSING,
        f"the event at position {named} is missing: position {inserted.appended_next} was "
        f"appended right after it, but the log has no event at {named}; it was removed, or "
        "the position it names was changed",
    )


def relinked(row: ChainRow, predecessor_hash: bytes) -> Break | None:
    """For an ``INSERTED`` break: ``row`` is the event that names an earlier predecessor
    than the one before it, and ``predecessor_hash`` that predecessor's stored chain hash.
    The genuine event that others were inserted before hashes as that predecessor's
    successor; one that does not is itself the change (its previous position edited, or
    the row added later with a link taken from another event), and the events between,
    which checked out, are the genuine ones: the break is at ``row``, as changed."""
    if row.chain_hash == chain_link(predecessor_hash, row):
        return None
    return Break(
        row.position,
        Problem.CHANGED,
        f"the event at position {row.position} names position {row.previous_position} as "
        "the one appended before it, but does not hash as its successor: its previous "
        "position or another column was changed after it was appended, or it was added "
        "later with a link taken from another event",
    )


class Head(msgspec.Struct, frozen=True):
    """The last event's position and chain hash: what ``--anchor`` takes back."""

    position: int
    chain_hash: bytes

    def __str__(self) -> str:
        return f"{self.position}:{self.chain_hash.hex()}"


def parse_anchor(text: str) -> Head:
    """``POSITION:HASH`` (a head as ``log head`` prints it) into a ``Head``."""
    match = _ANCHOR.fullmatch(text.strip())
    if match is None:
        raise InvalidAnchor(
            f"an anchor is POSITION:HASH, the position a whole number and the hash 64 hex "
            f"digits, as `llmgw-server log head` prints it; not {text!r}"
        )
    position = int(match[1])
    if position >= 2**63:
        raise InvalidAnchor(f"anchor position {position} is beyond any position")
    return Head(position, bytes.fromhex(match[2]))


class ChainWalk:
    """Feed it every event in position order (``step``), then ``finish``; each returns the
    first break found, after which the walk is over."""

    def __init__(self, anchors: Sequence[Head] = ()) -> None:
        self.head = Head(0, GENESIS)
        """The last event that checked out."""
        self.events = 0
        self._anchors = sorted(anchors, key=lambda anchor: anchor.position)
        self.anchors_passed: list[Head] = []
        self._trusted = (self.head, 0)
        """The last anchor passed and the events up to it: what is left to trust when a
        later anchor shows the log before it was rewritten."""

    def step(self, row: ChainRow) -> Break | None:
        found = (
            self._check_complete(row)
            or self._check_link(row)
            or self._check_anchors_before(row.position)
            or self._check_hash(row)
        )
        if found is not None:
            return found
        assert row.chain_hash is not None, "a null hash never matches"
        self.head = Head(row.position, row.chain_hash)
        self.events += 1
        return self._check_anchors_before(row.position + 1)

    def finish(self) -> Break | None:
        """After the last event: anchors the log does not reach."""
        found = self._check_anchors_before(self.head.position + 1)
        if found is not None:
            return found
        for anchor in self._anchors:
            if anchor.position > self.head.position:
                return Break(
                    anchor.position,
                    Problem.ANCHOR_BEYOND_END,
                    f"the log ends at position {self.head.position}, before the anchor at "
                    f"position {anchor.position}: events at the end were removed, or the "
                    "anchor is of another database",
                )
        return None

    def disown(self, inserted: int, genuine: Head) -> None:
        """After an ``INSERTED`` break: the last ``inserted`` events stepped through were
        added later, linked and hashed as if they belonged, so none of them checked out, and
        the last event that did is ``genuine``, the one they were inserted after. The walk
        keeps no history (memory stays constant), so the caller looks both up: the events
        after ``inserted_after`` up to the break, and the stored hash at ``inserted_after``,
        which the walk checked on its way (the genesis when that is position 0)."""
        self.events -= inserted
        self.head = genuine
        self.anchors_passed = [a for a in self.anchors_passed if a.position <= genuine.position]

    def _check_complete(self, row: ChainRow) -> Break | None:
        problem = unchainable(row)
        if problem is None:
            return None
        return Break(
            row.position,
            Problem.CHANGED,
            f"the event at position {row.position} {problem}: its columns were changed after "
            "it was appended",
        )

    def _check_link(self, row: ChainRow) -> Break | None:
        before, last = row.previous_position or 0, self.head.position
        if before == last:
            return None
        if before >= row.position:
            return Break(
                row.position,
                Problem.REORDERED,
                f"the event at position {row.position} was appended after position {before}, "
                "which is not before it: events were moved",
            )
        if before > last:
            return Break(
                before,
                Problem.MISSING,
                f"the event at position {before} is missing: position {row.position} was "
                f"appended right after it, and the log goes from {last or 'its start'} to "
                f"{row.position}; every event between them was removed or never existed, "
                f"{before} at least was appended",
            )
        return Break(
            last,
            Problem.INSERTED,
            f"events were inserted after position {before}: position {row.position} was "
            f"appended right after it, but now position {last} (and any between) stands "
            "between them",
            inserted_after=before,
            appended_next=row.position,
        )

    def _check_hash(self, row: ChainRow) -> Break | None:
        if row.chain_hash == chain_link(self.head.chain_hash, row):
            return None
        return Break(
            row.position,
            Problem.CHANGED,
            f"the event at position {row.position} does not match its chain hash: its "
            "payload or another column was changed after it was appended (or the chain hash "
            "of the event before it was)",
        )

    def _check_anchors_before(self, position: int) -> Break | None:
        """Every anchor before ``position`` must have been passed, at its hash."""
        while self._anchors and self._anchors[0].position < position:
            anchor = self._anchors.pop(0)
            if anchor.position != self.head.position:
                self._distrust_since_last_anchor()
                return Break(
                    anchor.position,
                    Problem.ANCHOR_MISSING,
                    f"the log has no event at position {anchor.position}, which the anchor "
                    f"{anchor} names: it was removed, or the anchor is of another database",
                )
            if anchor.chain_hash != self.head.chain_hash:
                rewritten = self.head.chain_hash
                self._distrust_since_last_anchor()
                return Break(
                    anchor.position,
                    Problem.ANCHOR_MISMATCH,
                    f"the chain hash at position {anchor.position} is "
                    f"{rewritten.hex()}, not the anchor's "
                    f"{anchor.chain_hash.hex()}: the log up to there was rewritten since the "
                    "anchor was recorded (or the anchor is of another database)",
                )
            self.anchors_passed.append(anchor)
            self._trusted = (anchor, self.events)
        return None

    def _distrust_since_last_anchor(self) -> None:
        """The events since the last anchor passed each hold their hash, but the anchor
        that failed shows the log up to it was rewritten (and rehashed) or cut: none of
        them is good, and the last good head is that anchor, or the genesis."""
        self.head, self.events = self._trusted
