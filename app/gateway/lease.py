"""A request's lease on one replica, from the router's ``acquire()`` until ``release()``.

It counts the request in its replica's ``in_flight`` and reserves a place on it
(``ReplicaState.reserve``) until the answer's first byte, or a scrape that counts it; it
carries the routing policy and the reason (``RouteReason``) of its choice; and it tells the
router's ejector (``app.gateway.ejection``) how the replica did.

What it needs of the router that granted it is two things, each named: the ``Ejector`` to
tell, and a ``CapacityReturn`` to tell when the replica has room again.
"""

from __future__ import annotations

from typing import Protocol

from app.gateway.admission import ReplicaState
from app.gateway.ejection import Ejector, Ticket
from app.gateway.replica_pools import RouteReason
from app.gateway.table import Route


class CapacityReturn(Protocol):
    """Who is told when a lease gives its replica room back (the ``Router``)."""

    def capacity_freed(self, replica: ReplicaState) -> None:
        """``replica`` has room again: its reservation ended, or its request did."""


class Lease:
    """One request on one replica, from ``acquire()`` until ``release()``."""

    __slots__ = (
        "_capacity",
        "_ejector",
        "_open",
        "_replica",
        "_ticket",
        "policy",
        "queued_s",
        "reason",
        "route",
    )

    def __init__(
        self,
        capacity: CapacityReturn,
        ejector: Ejector,
        replica: ReplicaState,
        queued_s: float,
        policy: str = "least_loaded",
        reason: RouteReason = "least_loaded",
    ) -> None:
        self.route: Route = replica.route
        self.queued_s = queued_s
        """Seconds the request waited in the queue for this lease (0 if none)."""
        self.policy = policy
        """The routing policy of the replica's model when it was chosen."""
        self.reason: RouteReason = reason
        """Why the router chose this replica."""
        self._capacity = capacity
        self._ejector = ejector
        self._replica = replica
        self._open = True
        self._ticket: Ticket = ejector.granted(replica.route.replica_id)
        replica.in_flight += 1
        replica.reserve(self)

    @property
    def probe(self) -> bool:
        """Whether this request is the probe of a replica on probation
        (``app.gateway.ejection``)."""
        return self._ticket.probe

    def succeeded(self) -> None:
        """The replica answered (a head below 500 and the first byte of its body; a stream's
        end): it is healthy, as far as passive health goes. Only the first verdict of a
        lease counts."""
        self._ejector.succeeded(self.route.replica_id, self._ticket)

    def failed(self, reason: str) -> None:
        """The replica failed before its answer's first byte of body (no answer, a 5xx
        head, or a body that broke off or stalled before it), or a stream broke off or
        stalled before its end."""
        self._ejector.failed(self.route.replica_id, self._ticket, reason)

    def first_byte(self) -> None:
        """The replica answered: the reservation ends (idempotent)."""
        if self._replica.unreserve(self):
            self._capacity.capacity_freed(self._replica)

    def release(self) -> None:
        """The request is over, however it ended (idempotent)."""
        if not self._open:
            return
        self._open = False
        self._ejector.abandoned(self.route.replica_id, self._ticket)
        self._replica.unreserve(self)
        self._replica.in_flight -= 1
        self._capacity.capacity_freed(self._replica)
