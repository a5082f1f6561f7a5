"""Errors the event store raises; driver errors never leak past the store.

StoreError
├── ConcurrencyError       a stream moved on since the caller read it; nothing was written
├── FencedError            the appender's leader epoch is no longer current
├── ClockOff               the events' time is too far from the database's clock; nothing
│                          was written
├── StoreUnavailable       the database cannot be reached
│   ├── AppendOutcomeUnknown   the connection broke once the append was sent: it may be in
│   │                          the log or not
│   └── CommitOutcomeUnknown   the connection broke once a rebuild's COMMIT was sent: the
│                              tables are as they were or wholly rebuilt
├── UnreadableEvent        a stored payload no longer decodes into any known event
├── UnreadableSnapshot     a fold snapshot is damaged, or was written by another fold
├── RuntimeRoleError       the runtime role cannot be set up, or could rewrite the log
├── RoleRefused            the database refused the connection's role: no such role, a
│   │                      password refused, or a privilege the work needs it lacks
│   └── PrivilegeRefused   the role was let in, but lacks a privilege the work needs
└── InvalidAnchor          (also a ValueError) not a head as ``log head`` prints it

Two more pass between a recorder and the store built on it and never reach a caller:
``LogMovedOn`` (the log is past what the caller folded: catch up, then try again) and
``AlreadyRecorded`` (an event id of the batch is stored: a retried request).
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the event store raises."""


class ConcurrencyError(StoreError):
    def __init__(self, stream: str, expected: int | None, actual: int) -> None:
        """``expected`` None: the stream was not appended at a version, but its change since
        the batch was decided makes the batch wrong (``EventStore.append_many``)."""
        moved = (
            f"is at version {actual}, not the expected {expected}"
            if expected is not None
            else f"changed (version {actual}) since the events were decided"
        )
        super().__init__(f"stream {stream!r} {moved}; nothing was written: reload and decide again")
        self.stream = stream
        self.expected = expected
        self.actual = actual


class FencedError(StoreError):
    def __init__(self, epoch: int, current: int) -> None:
        super().__init__(f"append refused: leader epoch {epoch} was superseded by epoch {current}")
        self.epoch = epoch
        self.current = current


class ClockOff(StoreError):
    """``llmgw_append`` refused the events' time, this machine's clock, as too far from the
    database's (migration 0017's ``LG005``): nothing was written, and no change this
    machine's clock times will be until it is set right."""

    def __init__(self, offset_s: float | None, slack_s: float) -> None:
        if offset_s is None:
            off = f"more than {slack_s:g} s off the database's"
        else:
            side = "ahead of" if offset_s > 0 else "behind"
            off = f"{abs(offset_s):.1f} s {side} the database's"
        super().__init__(
            f"this server's clock is {off}: nothing was written, as no change may be timed "
            f"more than {slack_s:g} s from the database's clock; set this server's clock right "
            "(NTP) or send the change to another control plane"
        )
        self.offset_s = offset_s


class StoreUnavailable(StoreError):
    """The database could not be reached or the connection broke mid-operation."""


class AppendOutcomeUnknown(StoreUnavailable):
    """The connection broke after the append reached the database and before its answer
    came back: PostgreSQL may have committed it or not, and only the log can tell."""

    def __init__(self, correlation_id: str | None, cause: str) -> None:
        look_for = (
            f"look for [{correlation_id}] in `llmgw-cli events --last 50`"
            if correlation_id
            else "read the newest events (`llmgw-cli events --last 50`)"
        )
        super().__init__(
            f"the database connection broke while the change was being committed ({cause}): "
            f"it may or may not have been recorded; {look_for} before asking again"
        )
        self.correlation_id = correlation_id
        self.cause = cause
        """The driver's words for how the connection broke."""


class CommitOutcomeUnknown(StoreUnavailable):
    """The connection broke after a transaction's ``COMMIT`` was sent and before its answer
    came back (``projections rebuild``): PostgreSQL committed all of it or none."""


class RoleRefused(StoreError):
    """PostgreSQL refused the role the command connected as: the role does not exist, its
    password or ``pg_hba.conf`` refused it (SQLSTATE class 28), or it lacks a privilege the
    work needs (``42501``). Connecting as another role is the fix, not trying again."""

    def __init__(self, message: str, *, missing_role: str | None = None) -> None:
        super().__init__(message)
        self.missing_role = missing_role
        """The role's name when PostgreSQL said that it does not exist."""


class PrivilegeRefused(RoleRefused):
    """The role was let in, but lacks a privilege the work needs (SQLSTATE ``42501``, as
    ``permission denied for table models``): another role may do it. Told by PostgreSQL's
    code, not its words, which a server set to another language says otherwise."""


class UnreadableEvent(StoreError):
    def __init__(self, position: int, event_type: str, detail: str) -> None:
        super().__init__(f"event {position} ({event_type}) cannot be decoded: {detail}")
        self.position = position


class UnreadableSnapshot(StoreError):
    def __init__(self, position: int, detail: str) -> None:
        super().__init__(f"the fold snapshot at position {position} cannot be used: {detail}")
        self.position = position
        self.detail = detail


class LogMovedOn(StoreError):
    """The log does not end where the caller's batch was folded: another writer appended
    after that position, or the log holds another event at it (it lost the caller's in a
    failover and went on with others)."""


class AlreadyRecorded(StoreError):
    """At least one event id of the batch is in the log already."""


class RuntimeRoleError(StoreError):
    """The runtime role cannot be created, or must not be used as one."""


class InvalidAnchor(StoreError, ValueError):
    """Not ``POSITION:HASH``."""
