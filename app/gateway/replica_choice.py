"""Which replica of a model takes a request now, by the model's routing policy; ``None``
when none can (the router then queues the request, ``app.gateway.router``).

While a model is in a rollout's canary step (``GatewaySnapshot.canaries``), its replicas are
two sides: those of the canary revision and the others. Each request draws once from the
random source: below the canary's share it goes to the canary side, otherwise to the
others, and the replica within that side is chosen by the same rule as without a canary.
A request with a key (``prefix``, ``session``) draws from its key instead
(``rendezvous.key_fraction``): its turns stay on one side, the same in every gateway. When
the drawn side has no replica that can take the request now (none is routable, or
every one is saturated), the other side takes it. The sides are split when a snapshot is
taken: a request costs one look-up more, and one draw in a canary step. Every gateway
splits by the same rule on its own.

Which eligible replica takes a request is the model's routing policy
(``GatewaySnapshot.policies``, ``docs/gateway-routing.md``): ``least_loaded`` is the rule
of ``app.gateway.admission``; ``prefix`` and ``session`` hash the request's key
(``app.gateway.affinity``) onto the model's replicas by weighted rendezvous hashing
(``app.domain.rendezvous``) with bounded loads, the load being the requests a replica
carries as admission counts them (``admission.carried``: the engine's running and waiting
ones and this gateway's reservations, much the same for every gateway; its own in-flight
while signals are stale); each replica adds to the total the bounds are shared from no more
waiting ones than its ``target_waiting``, and no running ones past ``MAX_RUNNING``
(``admission.counted``), so that an engine saying it holds a billion cannot raise every
other replica's bound. A replica the admission rule
refuses, or one above its bound, is passed over for the next on the key's walk. Replicas
left out (ejected, or excluded by a retry) are passed over too, and the bound is shared
among the others (``Rendezvous.pick``'s ``absent``). Draining replicas are on no walk
while others serve: their keys move on, and they are chosen only when no other replica can
take the request.
Each pool's ``Rendezvous`` is built when a snapshot is taken, and only when the model's
replicas or weights changed; a request costs a draw per replica (one multiplication makes
them all) and, when its home cannot take it, one sort.

Replicas that keep failing are passed over by this gateway for a while
(``app.gateway.ejection``): ``choose`` leaves the ejected replicas out, as it leaves out
those a retry excludes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from app.domain.rendezvous import Rendezvous, key_fraction
from app.gateway.admission import ReplicaState, assess, carried, choose, counted
from app.gateway.affinity import RouteKey
from app.gateway.ejection import Ejector
from app.gateway.replica_pools import KEYED_REASONS, CanarySplit, Choice, Pool, canary_split
from app.gateway.table import DEFAULT_ROUTE_POLICY, Canary, GatewaySnapshot, RoutePolicy

MIN_BOUND = 4
"""No replica's bound (``prefix``, ``session``) is below this many requests: an engine
batches a handful at no cost to any of them, and passing a key on to an idle replica at
such loads would cost its cache and gain nothing."""


class _Taken(NamedTuple):
    """What a model's pools were built from: rebuilt when any of it changes."""

    replicas: list[ReplicaState]
    canary: Canary | None
    policy: RoutePolicy

    def same_as(self, other: _Taken) -> bool:
        return (
            self.replicas is other.replicas
            and self.canary == other.canary
            and self.policy == other.policy
        )


class ReplicaChooser:
    """Chooses among the replicas of the last snapshot taken (``take``), by each model's
    routing policy, leaving out those ``ejector`` shuns."""

    __slots__ = (
        "_clock",
        "_draw",
        "_ejector",
        "_policies",
        "_pools",
        "_rendezvous",
        "_splits",
        "_taken",
        "stale_after_s",
    )

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        draw: Callable[[], float],
        ejector: Ejector,
        stale_after_s: float,
    ) -> None:
        self._clock = clock
        self._draw = draw
        self._ejector = ejector
        self.stale_after_s = stale_after_s
        """How old a replica's engine signals may be before admission judges it by this
        gateway's own in-flight count instead (``app.gateway.admission``)."""
        self._pools: dict[str, Pool] = {}
        self._splits: dict[str, CanarySplit] = {}
        self._policies: dict[str, RoutePolicy] = {}
        self._rendezvous: dict[str, dict[tuple[tuple[str, float], ...], Rendezvous]] = {}
        """Each model's rendezvous by members: kept while its members and weights are."""
        self._taken: dict[str, _Taken] = {}

    def take(self, snapshot: GatewaySnapshot, by_model: dict[str, list[ReplicaState]]) -> None:
        """Choose from ``by_model`` (the routed replicas of each model) from now on, by the
        policies and canary steps of ``snapshot``. A model whose list of replicas is the
        same object as the last time, under the same policy and canary step, keeps its
        pools and their rendezvous; only the others' are built again."""
        before = self._taken
        taken: dict[str, _Taken] = {}
        pools: dict[str, Pool] = {}
        splits: dict[str, CanarySplit] = {}
        rendezvous: dict[str, dict[tuple[tuple[str, float], ...], Rendezvous]] = {}
        for model, replicas in by_model.items():
            now = _Taken(
                replicas,
                snapshot.canaries.get(model),
                snapshot.policies.get(model, DEFAULT_ROUTE_POLICY),
            )
            was = before.get(model)
            if was is not None and was.same_as(now):
                pools[model] = self._pools[model]
                if (split := self._splits.get(model)) is not None:
                    splits[model] = split
                rendezvous[model] = self._rendezvous.get(model, {})
            else:
                pool = pools[model] = Pool(replicas)
                split = canary_split(now.canary, replicas)
                if split is not None:
                    splits[model] = split
                rendezvous[model] = self._build_rendezvous(
                    now.policy, pool, split, self._rendezvous.get(model, {})
                )
            taken[model] = now
        self._taken = taken
        self._pools = pools
        self._splits = splits
        self._policies = dict(snapshot.policies)
        self._rendezvous = rendezvous

    @staticmethod
    def _build_rendezvous(
        policy: RoutePolicy,
        pool: Pool,
        split: CanarySplit | None,
        before: dict[tuple[tuple[str, float], ...], Rendezvous],
    ) -> dict[tuple[tuple[str, float], ...], Rendezvous]:
        """Give a model's pool (and its split's sides), when its policy hashes, a
        rendezvous: the one it had when its members and weights are unchanged, else a new
        one. Returns the model's rendezvous by members."""
        built: dict[tuple[tuple[str, float], ...], Rendezvous] = {}
        if policy.policy == "least_loaded":
            return built
        for each in (pool,) if split is None else (pool, split.canary, split.stable):
            members = each.keyed_members()
            each.rendezvous = built[members] = (
                built.get(members) or before.get(members) or Rendezvous(members)
            )
        return built

    def policy_of(self, model: str) -> RoutePolicy:
        return self._policies.get(model, DEFAULT_ROUTE_POLICY)

    def rendezvous_of(self, model: str) -> Rendezvous | None:
        """The rendezvous ``model``'s keyed requests are hashed on (its walks say which
        replica each key tries first, and then next): ``None`` under ``least_loaded``, or
        for a model with no route. In a canary step each side has its own, within this."""
        pool = self._pools.get(model)
        return None if pool is None else pool.rendezvous

    def choose(
        self, model: str, exclude: frozenset[str], route_key: RouteKey | None = None
    ) -> Choice:
        """The replica of ``model`` (none of ``exclude``) that takes a request with
        ``route_key`` now, and why; ``None`` when none can."""
        pool = self._pools.get(model)
        if pool is None:
            return None
        now = self._clock()
        # Passive health: replicas this gateway ejected are passed over (app.gateway.ejection).
        if shunned := self._ejector.shunned(model, exclude):
            exclude = exclude | shunned
        policy = self.policy_of(model)
        split = self._splits.get(model)
        if split is None:
            return self._choose_among(pool, exclude, now, policy, route_key)
        # A keyed request draws from its key: its turns stay on one side, in every gateway.
        if route_key is not None and policy.policy != "least_loaded":
            draw = key_fraction(route_key.value)
        else:
            draw = self._draw()
        if draw < split.share:
            drawn, other = split.canary, split.stable
        else:
            drawn, other = split.stable, split.canary
        chosen = self._choose_among(drawn, exclude, now, policy, route_key)
        if chosen is not None:
            return chosen
        return self._choose_among(other, exclude, now, policy, route_key)

    def _choose_among(
        self,
        pool: Pool,
        exclude: frozenset[str],
        now: float,
        policy: RoutePolicy,
        route_key: RouteKey | None,
    ) -> Choice:
        rendezvous = pool.rendezvous
        if route_key is not None and rendezvous is not None:
            by_id, stale_after_s = pool.by_id, self.stale_after_s

            def refuse(replica_id: str) -> bool:
                return (
                    assess(
                        by_id[replica_id],
                        now=now,
                        stale_after_s=stale_after_s,
                        max_in_flight=policy.max_in_flight,
                    )
                    is None
                )

            pick = rendezvous.pick(
                route_key.value,
                load_of=lambda replica_id: carried(
                    by_id[replica_id], now=now, stale_after_s=stale_after_s
                ),
                load_factor=policy.load_factor,
                refuse=refuse,
                absent=exclude,
                min_bound=MIN_BOUND,
                counted_of=lambda replica_id: counted(
                    by_id[replica_id], now=now, stale_after_s=stale_after_s
                ),
            )
            if pick.member is not None:
                return by_id[pick.member], KEYED_REASONS[pick.reason]
        replicas: Sequence[ReplicaState] = pool.replicas
        if exclude:
            replicas = [s for s in replicas if s.route.replica_id not in exclude]
        chosen = choose(
            replicas,
            now=now,
            stale_after_s=self.stale_after_s,
            max_in_flight=policy.max_in_flight,
        )
        if chosen is None:
            return None
        if policy.policy == "least_loaded":
            return chosen, "least_loaded"
        return chosen, "no_key" if route_key is None else "fallback"
