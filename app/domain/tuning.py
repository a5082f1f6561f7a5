"""Routing settings measured by ``llmgw-cli bench``, applied to a model or to one replica.

A model's settings apply to every replica of it that has none of its own; a replica's
override the model's for that replica alone (the ``routing_table`` view and the gateway
read them in that order). Settings already in force record nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from app.domain.events import ModelTuned, model_stream
from app.domain.model_spec import RoutingSettings, SpecError, routing_setting_errors
from app.domain.operations import (
    Change,
    InvalidFields,
    InvalidOperation,
    InvalidSpec,
    find_model,
)
from app.domain.state import ACTIVE_PHASES, ClusterState

MAX_SUMMARY_BYTES = 64 * 1024
"""A bench summary is a few hundred bytes; the cap keeps the log from being a dumping ground."""


class InvalidTuning(InvalidSpec):
    """Settings that break the rules of ``routing_errors``; ``errors`` has them all."""

    def __init__(self, model: str, errors: Sequence[SpecError]) -> None:
        InvalidFields.__init__(self, f"tuning of model {model!r} is invalid", errors)


def routing_errors(routing: RoutingSettings, summary: Mapping[str, Any]) -> list[SpecError]:
    errors = routing_setting_errors(routing)
    if len(msgspec.json.encode(summary)) > MAX_SUMMARY_BYTES:
        errors.append(SpecError("summary", f"must encode to at most {MAX_SUMMARY_BYTES} bytes"))
    return errors


def tune(
    state: ClusterState,
    model_name: str,
    replica_id: str | None,
    routing: RoutingSettings,
    summary: Mapping[str, Any],
) -> Change:
    """Record ``routing`` for the model, or for ``replica_id`` (an active replica of it)."""
    model = find_model(state, model_name)
    if model.removed:
        raise InvalidOperation(
            f"model {model_name} was removed; apply its spec to declare it again"
        )
    errors = routing_errors(routing, summary)
    current: RoutingSettings | None = model.spec.routing
    if replica_id is not None:
        replica = state.replicas.get(replica_id)
        if replica is None:
            errors.append(SpecError("replica_id", f"no replica {replica_id!r} is known"))
        elif replica.model != model_name:
            errors.append(
                SpecError("replica_id", f"is a replica of model {replica.model!r}, not this one")
            )
        elif replica.phase not in ACTIVE_PHASES:
            errors.append(SpecError("replica_id", f"has ended ({replica.phase.value})"))
        else:
            current = replica.routing
    if errors:
        raise InvalidTuning(model_name, errors)
    stream = model_stream(model_name)
    if current is not None and _measured(current) == _measured(routing):
        return Change(stream=stream)
    tuned = ModelTuned(
        model=model_name,
        replica_id=replica_id,
        weight=routing.weight,
        target_waiting=routing.target_waiting,
        kv_ceiling=routing.kv_ceiling,
        summary=dict(summary),
    )
    return Change(stream=stream, events=(tuned,))


def _measured(routing: RoutingSettings) -> tuple[float, int, float]:
    """What bench measures and a tuning records; the policy is the spec's alone."""
    return routing.weight, routing.target_waiting, routing.kv_ceiling
