"""A snapshot is taken in at the cost of what changed: a read of changes keeps the route
tuple of every model it did not touch, and the egress check and the router pass over the
models whose tuple they saw already. The oracle: after every snapshot of a sequence, what
routing depends on is what a fresh ``EngineEgress`` and ``Router`` make of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.egress import EngineNetworks
from app.gateway.admission import Signals
from app.gateway.egress import EngineEgress
from app.gateway.held_routes import HeldRoutes
from app.gateway.metrics import GatewayMetrics
from app.gateway.router import Router
from app.gateway.snapshot import DatedRows, route_of, routing_of
from app.gateway.table import GatewaySnapshot
from app.store.routing_rows import (
    CanaryRow,
    PolicyRow,
    RouteChanges,
    RouteRow,
    RoutingRows,
)
from tests.support.route_rows import route_row

MODELS = ("llama", "qwen", "mistral")
REPLICAS = tuple(f"r{i}" for i in range(8))
ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.9.0.1")
"""The last one is outside the engine networks: its routes are refused."""
NETWORKS = "127.0.0.0/16"


@dataclass
class Fleet:
    """The rows a database would hold, and what a gateway's reads of changes see of them."""

    routes: dict[str, RouteRow] = field(default_factory=dict)
    canaries: dict[str, CanaryRow] = field(default_factory=dict)
    policies: dict[str, PolicyRow] = field(default_factory=dict)
    position: int = 0

    def rows(self, changed: RouteChanges | None) -> RoutingRows:
        routes = list(self.routes.values())
        if changed is not None:
            routes = [self.routes[r] for r in changed.replicas if r in self.routes]
        return RoutingRows(
            position=self.position,
            declared=list(MODELS),
            created={},
            canaries=list(self.canaries.values()),
            cold_starts=[],
            start_failures=[],
            scaled_to_zero=[],
            starting={},
            policies=list(self.policies.values()),
            routes=routes,
            apis=[],
            keys=[],
            changed=changed,
        )


def read(
    fleet: Fleet, held: HeldRoutes | None, touched: list[str], *, whole: bool = False
) -> tuple[GatewaySnapshot, HeldRoutes]:
    """The snapshot a read of the changes to ``touched`` makes after ``held``; of every
    route without ``held`` or with ``whole``, taken in against ``held``."""
    fleet.position += 1
    changed = None if held is None or whole else RouteChanges(replicas=touched)
    return routing_of(DatedRows(fleet.rows(changed), 0.0), held)


def policy_row(model: str, policy: str) -> PolicyRow:
    return PolicyRow(model=model, routing=msgspec.Raw(msgspec.json.encode({"policy": policy})))


# -- one change at a time ------------------------------------------------------------------

Change = tuple[str, str, str, int]
"""(what, replica or model, model or policy, a number): see ``apply``."""

changes = st.lists(
    st.tuples(
        st.tuples(
            st.sampled_from(
                ("place", "remove", "address", "weight", "revision", "drain", "canary", "policy")
            ),
            st.sampled_from(REPLICAS + MODELS),
            st.sampled_from((*MODELS, "least_loaded", "prefix", "session")),
            st.integers(min_value=0, max_value=2),
        ),
        st.booleans(),
    ),
    max_size=25,
)
"""Changes, each with whether the read after it reads every route (as a gateway does on a
connection, every 30 s and after a rebuild) rather than the changes."""


def apply(fleet: Fleet, change: Change) -> list[str]:
    """Make ``change`` to ``fleet``; the replicas whose routes it changed."""
    what, subject, other, number = change
    replica = subject if subject in REPLICAS else REPLICAS[MODELS.index(subject)]
    model = subject if subject in MODELS else other if other in MODELS else MODELS[number]
    row = fleet.routes.get(replica)
    if what == "place":
        fleet.routes[replica] = route_row(replica, model, revision=1 + number % 2)
    elif what == "remove":
        fleet.routes.pop(replica, None)
    elif what == "canary":
        if number == 0:
            fleet.canaries.pop(model, None)
        else:
            fleet.canaries[model] = CanaryRow(model=model, revision=2, traffic=number / 4)
        return []
    elif what == "policy":
        policy = other if other not in MODELS else "least_loaded"
        fleet.policies[model] = policy_row(model, policy)
        return []
    elif row is not None:
        if what == "address":
            row = msgspec.structs.replace(row, address=ADDRESSES[number])
        elif what == "weight":
            row = msgspec.structs.replace(row, weight=1.0 + number)
        elif what == "revision":
            row = msgspec.structs.replace(row, revision=1 + number % 2)
        else:
            row = msgspec.structs.replace(row, draining=number == 1)
        fleet.routes[replica] = row
    return [replica]


def routing_of_router(router: Router, models: frozenset[str]) -> dict[str, object]:
    """What a router routes by: its replicas by model with their routes, pools, canary
    splits and rendezvous, each model's policy, and the replicas its ejector tracks."""
    chooser = router._chooser
    splits = {
        model: (
            split.share,
            [s.route for s in split.canary.replicas],
            [s.route for s in split.stable.replicas],
            members(split.canary.rendezvous),
            members(split.stable.rendezvous),
        )
        for model, split in chooser._splits.items()
    }
    return {
        "replicas": {
            m: [s.route for s in states] for m, states in router.replicas.by_model.items()
        },
        "pools": {m: [s.route for s in pool.replicas] for m, pool in chooser._pools.items()},
        "rendezvous": {m: members(router.rendezvous_of(m)) for m in models},
        "splits": splits,
        "policies": {m: router.policy_of(m) for m in models},
        "tracked": router.ejector.routed(),
    }


def members(rendezvous: object) -> object:
    return None if rendezvous is None else (rendezvous.members, rendezvous.weights)  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None)
@given(changes)
def test_snapshots_taken_in_by_their_changes_route_as_fresh_ones(
    steps: list[tuple[Change, bool]],
) -> None:
    fleet = Fleet()
    for i, replica in enumerate(REPLICAS[:4]):
        fleet.routes[replica] = route_row(replica, MODELS[i % 2])
    egress = EngineEgress(EngineNetworks.parse(NETWORKS), GatewayMetrics())
    router = Router()
    snapshot, held = read(fleet, None, [])
    before = snapshot
    router.update(egress.admit(snapshot))
    for step, whole_read in steps:
        states = {}
        for routed in router.replicas.by_model.values():
            for state in routed:
                state.in_flight += 1
                state.signals = Signals(waiting=1, running=2, kv_usage=0.5, scraped_at=0.0)
                states[state.route.replica_id] = (state, state.route.url, state.in_flight)
        rows_before = dict(fleet.routes)
        touched = apply(fleet, step)
        snapshot, held = read(fleet, held, touched, whole=whole_read)
        whole, _ = read(fleet, None, [])
        assert snapshot.routes == whole.routes
        assert snapshot.canaries == whole.canaries
        assert snapshot.policies == whole.policies
        models_touched = {
            rows.model
            for rows_of in (rows_before, fleet.routes)
            for r in touched
            if (rows := rows_of.get(r))
        }
        for model, routes in snapshot.routes.items():
            if model not in models_touched:
                assert routes is before.routes[model]  # an untouched model keeps its tuple
        before = snapshot

        admitted = egress.admit(snapshot)
        fresh_egress = EngineEgress(EngineNetworks.parse(NETWORKS), GatewayMetrics())
        fresh_admitted = fresh_egress.admit(whole)
        assert admitted.routes == fresh_admitted.routes
        assert egress._refused == fresh_egress._refused

        router.update(admitted)
        fresh = Router()
        fresh.update(fresh_admitted)
        models = frozenset(MODELS)
        kept = routing_of_router(router, models)
        expected = routing_of_router(fresh, models)
        assert kept == expected
        for routed in router.replicas.by_model.values():
            for state in routed:
                if (old := states.get(state.route.replica_id)) is not None:
                    # A kept replica keeps its counts, and its signals while its URL stays.
                    assert state is old[0]
                    assert state.in_flight == old[2]
                    assert (state.signals is not None) == (state.route.url == old[1])


# -- what is passed over, and what is not ---------------------------------------------------


def test_a_read_of_changes_keeps_the_tuple_of_every_model_it_did_not_touch() -> None:
    fleet = Fleet()
    fleet.routes = {"r0": route_row("r0", "llama"), "r1": route_row("r1", "qwen")}
    first, held = read(fleet, None, [])
    fleet.routes["r1"] = route_row("r1", "qwen", address="127.0.0.2")

    second, _ = read(fleet, held, ["r1"])

    assert second.routes["llama"] is first.routes["llama"]
    assert second.routes["qwen"] != first.routes["qwen"]


def test_a_read_of_every_route_keeps_the_tuple_of_every_model_whose_rows_it_found_alike() -> None:
    fleet = Fleet()
    fleet.routes = {
        "r0": route_row("r0", "llama"),
        "r1": route_row("r1", "qwen"),
        "r2": route_row("r2", "mistral"),
    }
    first, held = read(fleet, None, [])
    fleet.routes["r1"] = route_row("r1", "qwen", address="127.0.0.2")
    del fleet.routes["r2"]

    second, held = read(fleet, held, [], whole=True)

    assert second.routes["llama"] is first.routes["llama"]
    assert second.routes["qwen"] == (route_of(fleet.routes["r1"]),)
    assert "mistral" not in second.routes
    third, _ = read(fleet, held, [], whole=True)
    assert third.routes["qwen"] is second.routes["qwen"]


def test_the_router_keeps_the_replicas_of_a_model_whose_tuple_it_saw() -> None:
    fleet = Fleet()
    fleet.routes = {"r0": route_row("r0", "llama"), "r1": route_row("r1", "qwen")}
    first, held = read(fleet, None, [])
    router = Router()
    router.update(first)
    llama = router.replicas.by_model["llama"]
    pool = router._chooser._pools["llama"]
    fleet.routes["r2"] = route_row("r2", "qwen")

    second, _ = read(fleet, held, ["r2"])
    router.update(second)

    assert router.replicas.by_model["llama"] is llama
    assert router._chooser._pools["llama"] is pool
    assert router.ejector.routed() == {"r0": "llama", "r1": "qwen", "r2": "qwen"}
    assert [s.route.replica_id for s in router.replicas.by_model["qwen"]] == ["r1", "r2"]


def test_a_canary_changed_alone_is_split_again() -> None:
    """The routes are the same tuple, but the canary step is not: the split follows it."""
    fleet = Fleet()
    fleet.routes = {
        "r0": route_row("r0", "llama", revision=1),
        "r1": route_row("r1", "llama", revision=2),
    }
    fleet.canaries["llama"] = CanaryRow(model="llama", revision=2, traffic=0.25)
    first, held = read(fleet, None, [])
    router = Router()
    router.update(first)
    fleet.canaries["llama"] = CanaryRow(model="llama", revision=1, traffic=0.5)

    second, _ = read(fleet, held, [])
    assert second.routes["llama"] is first.routes["llama"]
    router.update(second)

    split = router._chooser._splits["llama"]
    assert split.share == 0.5
    assert [s.route.replica_id for s in split.canary.replicas] == ["r0"]


def test_a_policy_changed_alone_hashes_the_model_again() -> None:
    fleet = Fleet()
    fleet.routes = {"r0": route_row("r0", "llama"), "r1": route_row("r1", "llama")}
    first, held = read(fleet, None, [])
    router = Router()
    router.update(first)
    assert router.rendezvous_of("llama") is None
    fleet.policies["llama"] = policy_row("llama", "prefix")

    second, _ = read(fleet, held, [])
    router.update(second)

    assert router.policy_of("llama").policy == "prefix"
    assert members(router.rendezvous_of("llama")) == (("r0", "r1"), {"r0": 1.0, "r1": 1.0})


def test_the_egress_check_keeps_what_it_made_of_a_model_whose_tuple_it_saw() -> None:
    fleet = Fleet()
    fleet.routes = {
        "r0": route_row("r0", "llama", address="127.9.0.1"),
        "r1": route_row("r1", "llama"),
        "r2": route_row("r2", "qwen"),
    }
    first, held = read(fleet, None, [])
    egress = EngineEgress(EngineNetworks.parse(NETWORKS), GatewayMetrics())
    admitted = egress.admit(first)
    fleet.routes["r3"] = route_row("r3", "qwen")

    second, _ = read(fleet, held, ["r3"])
    again = egress.admit(second)

    assert again.routes["llama"] is admitted.routes["llama"]
    assert [route.replica_id for route in again.routes["llama"]] == ["r1"]


def test_a_model_gone_takes_its_refused_routes_out_of_the_count() -> None:
    fleet = Fleet()
    fleet.routes = {
        "r0": route_row("r0", "llama", address="127.9.0.1"),
        "r1": route_row("r1", "qwen"),
    }
    first, held = read(fleet, None, [])
    metrics = GatewayMetrics()
    egress = EngineEgress(EngineNetworks.parse(NETWORKS), metrics)
    egress.admit(first)
    refused_routes = "llmgw_gateway_egress_refused_routes"
    assert metrics.registry.get_sample_value(refused_routes) == 1
    del fleet.routes["r0"]

    second, _ = read(fleet, held, ["r0"])
    assert "llama" not in second.routes
    assert egress.admit(second) is second

    assert metrics.registry.get_sample_value(refused_routes) == 0
