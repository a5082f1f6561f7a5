"""A lease needs of the router that granted it only its ejector and a ``CapacityReturn``:
it runs here against a plain recorder of freed capacity, no router at all."""

from __future__ import annotations

from app.gateway.admission import ReplicaState
from app.gateway.ejection import Ejector
from app.gateway.lease import CapacityReturn, Lease
from app.gateway.table import Route


class FreedCapacity:
    """A ``CapacityReturn`` that writes down each replica it is told has room again."""

    def __init__(self) -> None:
        self.freed: list[str] = []

    def capacity_freed(self, replica: ReplicaState) -> None:
        self.freed.append(replica.route.replica_id)


def lease_on(replica: ReplicaState, capacity: CapacityReturn) -> Lease:
    return Lease(capacity, Ejector(), replica, queued_s=0.0)


def test_a_lease_counts_its_request_and_reserves_a_place_until_its_first_byte() -> None:
    capacity = FreedCapacity()
    replica = ReplicaState(Route(replica_id="r1", model="m", url="http://127.0.0.7:8001"))

    lease = lease_on(replica, capacity)
    assert (replica.in_flight, replica.reserved) == (1, 1)

    lease.first_byte()
    lease.first_byte()
    assert (replica.in_flight, replica.reserved) == (1, 0)
    assert capacity.freed == ["r1"], "the reservation ends once, and says so once"


def test_releasing_a_lease_gives_its_room_back_once() -> None:
    capacity = FreedCapacity()
    replica = ReplicaState(Route(replica_id="r1", model="m", url="http://127.0.0.7:8001"))
    lease = lease_on(replica, capacity)

    lease.release()
    lease.release()

    assert (replica.in_flight, replica.reserved) == (0, 0)
    assert capacity.freed == ["r1"]
