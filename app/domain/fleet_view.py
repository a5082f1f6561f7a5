"""What the fleet says right now: not in the log, observed live.

The hub keeps one ``NodeReport`` per node that said hello to this control plane: the
hello's shard inventory, updated by heartbeats and shard status messages. Gateways report
how many requests each replica has in flight (``in_flight``), so a replica taken out of
routing is stopped only once it is idle."""

from __future__ import annotations

import msgspec

RUNNING_STATES = frozenset({"starting", "ready"})


class ReportedShard(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    shard_index: int
    model: str
    port: int
    pid: int | None
    state: str

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def ready(self) -> bool:
        return self.state == "ready"


class NodeReport(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    shards: dict[tuple[str, int], ReportedShard] = {}


class FleetView(msgspec.Struct, frozen=True, kw_only=True):
    reports: dict[str, NodeReport] = {}
    in_flight: dict[str, int] = {}
    """Requests open on each replica, summed over the gateways that reported recently;
    a replica no gateway reports has none."""
