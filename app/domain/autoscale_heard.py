"""Whether the gateways heard of a request for a model lately: what tells an idle model from
one whose requests are short and few. A pure reading, no I/O.

A model's demand is sampled once a pass as the requests in flight at that moment, and a
request of 50 ms every few seconds is almost never in flight then: by the samples alone
such a model would look idle and go to zero between its requests. Every gateway also
reports what each replica answered, failed and cancelled over its sliding window
(``gateway_reports.traffic``): a request to any of the model's replicas in any live
gateway's window says one came within that window, however short it was. A gateway's
report lists only so many replicas, the busiest, and a lightly used model's are the ones it
leaves out: it names the models it heard among those (``app.domain.traffic_left_out``), and
a model it names, whose replicas it does not list, is heard all the same.

Only models that may go to zero ask (autoscaled, ``min`` 0): for the others idleness
decides nothing, and a pass reads nothing for them. Ended replicas count too: a request
answered by a replica stopped since is a request for the model all the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.domain.state import ClusterState
from app.domain.traffic import TrafficFigures


def replicas_to_hear(state: ClusterState) -> dict[str, list[str]]:
    """Each model that may go to zero (autoscaled with ``min`` 0, not removed), with every
    replica of it the state knows, ended ones included; empty when there is none, and
    then nothing is read."""
    groups: dict[str, list[str]] = {
        name: []
        for name, model in state.models.items()
        if model.spec.autoscale is not None
        and model.spec.autoscale.min_replicas == 0
        and not model.removed
    }
    if not groups:  # the common case: no walk over every replica the state knows
        return groups
    for replica_id, replica in state.replicas.items():
        members = groups.get(replica.model)
        if members is not None:
            members.append(replica_id)
    return groups


def heard_within(figures: Mapping[str, TrafficFigures]) -> dict[str, float]:
    """The models whose replicas some gateway's window holds a request of (answered, failed
    or cancelled), listed in its report or left out of it (``TrafficFigures.unlisted``),
    each with the longest window the live gateways report: how long ago that request may
    have ended at most."""
    return {
        model: group.window_s
        for model, group in figures.items()
        if group.requests > 0 or group.cancelled > 0 or group.unlisted > 0
    }
