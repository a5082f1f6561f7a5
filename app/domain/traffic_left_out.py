"""What a gateway's traffic report says of the replicas it leaves out, and what a reader
makes of that. Pure, no I/O.

A report lists a bounded number of replicas, the busiest (``app.store.gateway_reports``).
A gateway that served more within its window leaves the least used out, and those are the
replicas of the models with few requests: the very models the autoscaler would take for
idle, and a canary still warming up. So a report that leaves replicas out says so
(``LeftOut``): how many, and the models it heard requests for among them, at most
``MAX_MODELS_NAMED`` by name; past that, or for a replica whose id names no model, it says that
it could not name them all, and a reader then takes any model for one of them.

A reader asks for groups of replicas (a model's, a revision's). A gateway's figures of a
group may lack requests when its report left replicas out and does not list some member of
the group whose model it heard among them (``may_lack``): the figures say so
(``TrafficFigures.unlisted``), and the autoscaler counts such a model as heard.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping
from typing import Annotated, NamedTuple

import msgspec

from app.domain.model_spec import NAME_PATTERN
from app.domain.traffic import Count, ReplicaTraffic, TrafficFigures, combined, merge

MAX_MODELS_NAMED = 2000
"""A report names at most this many models among the replicas it leaves out (as many as
it lists queues of); a reader refuses more."""

ModelName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN.pattern)]


class LeftOut(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``gateway_reports.traffic.left_out``: what a report says of the replicas it does not
    list. Its wire form too, so every field is bounded for a reader of a hostile row."""

    replicas: Count
    """How many replicas the window held that the report does not list."""
    models: Annotated[frozenset[ModelName], msgspec.Meta(max_length=MAX_MODELS_NAMED)]
    """The models of those of them that had a request in the window (answered, failed or
    cancelled)."""
    unnamed_models: bool = False
    """Some of those replicas' models are not in ``models``: more models than a report
    names, or a replica id that names none. A reader takes any model for one of them."""


UNREADABLE = LeftOut(replicas=0, models=frozenset(), unnamed_models=True)
"""What a reader makes of a report that says it left replicas out in a form the reader
cannot read (malformed, too big): that any model may be among them, as it would of a report
that could not name them all. Read as leaving nothing out, it would let the autoscaler take
a model that gateway heard for idle. How many it left out is not known: 0."""


def model_of_replica(replica_id: str) -> str:
    """The model a replica's id names: ids are ``<model>-<n>`` (``events.replica_id_for``),
    and ``n`` holds no ``-``. Empty for an id made otherwise."""
    return replica_id.rpartition("-")[0]


def leaving_out(
    replica_ids: Collection[str],
    heard: Iterable[str],
    *,
    most_models: int = MAX_MODELS_NAMED,
    earlier: LeftOut | None = None,
) -> LeftOut:
    """What a report that leaves ``replica_ids`` out says of them: ``heard``, those of them
    with a request in the window, named by model, at most ``most_models`` names (the first
    by name); ``earlier``: what the report already left out, added."""
    names = set(earlier.models) if earlier is not None else set()
    unnamed = earlier is not None and earlier.unnamed_models
    for replica_id in heard:
        model = model_of_replica(replica_id)
        if NAME_PATTERN.fullmatch(model):
            names.add(model)
        else:
            unnamed = True
    if len(names) > most_models:
        names = set(sorted(names)[:most_models])
        unnamed = True
    return LeftOut(
        replicas=len(replica_ids) + (earlier.replicas if earlier is not None else 0),
        models=frozenset(names),
        unnamed_models=unnamed,
    )


def may_lack(members: Iterable[str], listed: Container[str], left_out: LeftOut | None) -> bool:
    """Whether a gateway's figures of a group of replicas (``members``) may lack requests
    to some of them: its report left replicas out (``left_out``), and does not list (in
    ``listed``) a member whose model it heard among those."""
    if left_out is None:
        return False
    return any(
        member not in listed
        and (left_out.unnamed_models or model_of_replica(member) in left_out.models)
        for member in members
    )


class GatewayTraffic(NamedTuple):
    """What one gateway's report says of the replicas a reader asked for: its window, those
    of them it lists, and what it says of the replicas it left out (None: it left none)."""

    window_s: float
    parts: Mapping[str, ReplicaTraffic]
    left_out: LeftOut | None


def figures_of_groups(
    groups: Mapping[str, Collection[str]], seen: Collection[GatewayTraffic]
) -> dict[str, TrafficFigures]:
    """Each group's replicas' figures added up over the gateways ``seen``, with, in
    ``unlisted``, how many of those gateways' reports may have left some of them out."""
    figures: dict[str, TrafficFigures] = {}
    for group, members in groups.items():
        merged = merge(
            (gateway.window_s, combined(gateway.parts[m] for m in members if m in gateway.parts))
            for gateway in seen
        )
        if merged is None:
            continue
        unlisted = sum(1 for g in seen if may_lack(members, g.parts, g.left_out))
        figures[group] = msgspec.structs.replace(merged, unlisted=unlisted) if unlisted else merged
    return figures
