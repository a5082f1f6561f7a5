"""Replicas listed a page at a time, in one order: by model, then number (then id, which no
two replicas share), the order the list has always had.

The log never forgets a replica, so the list of every replica grows without end; a page is
read after the replica a caller last saw (its id: ``after``) and holds at most ``limit``.
Where that replica sorts is read off the replica itself, so the page start must be one the
log knows: any other is ``UnknownPageStart``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import msgspec

from app.domain.operation_results import UnknownReplica
from app.domain.state import Replica

ListingKey = tuple[str, int, str]
"""Where a replica sorts in the list: its model, number and id."""


class UnknownPageStart(UnknownReplica):
    """A page of replicas asked to start after a replica id that names no replica."""

    kind = "replica (by id) to list the replicas after"


def listing_key(replica: Replica) -> ListingKey:
    return (replica.model, replica.number, replica.id)


class ReplicaPage(msgspec.Struct, frozen=True, kw_only=True):
    """The replicas that sort after ``after`` (all when None), at most ``limit`` of them
    (all when None)."""

    after: ListingKey | None = None
    limit: int | None = None

    def of(self, replicas: Iterable[Replica]) -> list[Replica]:
        """This page of ``replicas``, in listing order."""
        after = self.after
        listed = (r for r in replicas if after is None or listing_key(r) > after)
        if self.limit is None:
            return sorted(listed, key=listing_key)
        # A page of the fold's replicas and the forgotten ones: keep the first, not sort all.
        return heapq.nsmallest(self.limit, listed, key=listing_key)


WHOLE_LIST = ReplicaPage()
"""Every replica, as one page."""
