"""Routing settings measured by ``llmgw-cli bench``, applied to a model or to one replica.

A model's settings apply to every replica of it that has none of its own; a replica's
override the model's for that replica alone (the ``routing_table`` view and the gateway
read them in that order). Settings already in force record nothing.

The summary is what bench measured, kept in the log with the settings. The autoscaler reads
one figure of it, ``capacity`` (the concurrency a replica served within its SLO), so that
figure is bounded; every other number in it must at least be one the log gives back as it
was: finite, since the log's JSON has no infinity or NaN and would turn one into null, and
within ``MAX_SUMMARY_MAGNITUDE``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from app.domain.events import ModelTuned, model_stream
from app.domain.free_text import LINES, control_character_errors
from app.domain.model_operations import find_model
from app.domain.model_spec import RoutingSettings, SpecError, routing_setting_errors
from app.domain.operation_results import (
    Change,
    InvalidFields,
    InvalidOperation,
    InvalidSpec,
)
from app.domain.state import ACTIVE_PHASES, ClusterState

MAX_SUMMARY_BYTES = 64 * 1024
"""A bench summary is a few hundred bytes; the cap keeps the log from being a dumping ground."""
MIN_BENCH_CAPACITY = 1
"""The least concurrency a summary may say a replica served: bench applies nothing when even
one request at a time broke the SLO."""
MAX_BENCH_CAPACITY = 100_000
"""Far above any engine's concurrency (``MAX_AUTOSCALE_TARGET``)."""
MAX_SUMMARY_MAGNITUDE = 2**53
"""The largest number a summary may hold, of either sign: up to it, every whole number is
exact in any JSON reader and a float reads back from the log as itself. PostgreSQL writes a
float from 1e16 on as a whole number (1e23 as 1 and 23 zeros, which is not the float), so the
fold after a restart would differ from the one before, and a fold snapshot cannot hold a
whole number beyond 64 bits."""


class InvalidTuning(InvalidSpec):
    """Settings that break the rules of ``routing_errors``; ``errors`` has them all."""

    def __init__(self, model: str, errors: Sequence[SpecError]) -> None:
        InvalidFields.__init__(self, f"tuning of model {model!r} is invalid", errors)


def routing_errors(routing: RoutingSettings, summary: Mapping[str, Any]) -> list[SpecError]:
    errors = routing_setting_errors(routing)
    if len(msgspec.json.encode(summary)) > MAX_SUMMARY_BYTES:
        errors.append(SpecError("summary", f"must encode to at most {MAX_SUMMARY_BYTES} bytes"))
        return errors
    return errors + summary_errors(summary)


def summary_errors(summary: Mapping[str, Any]) -> list[SpecError]:
    """What is wrong with a bench summary: its ``capacity`` out of bounds, any number in it
    not finite or beyond ``MAX_SUMMARY_MAGNITUDE``, any string in it holding a control
    character other than a tab or line feed."""
    errors: list[SpecError] = []
    capacity = summary.get("capacity", MIN_BENCH_CAPACITY)
    number = isinstance(capacity, int | float) and not isinstance(capacity, bool)
    if not (number and MIN_BENCH_CAPACITY <= capacity <= MAX_BENCH_CAPACITY):
        errors.append(
            SpecError(
                "summary.capacity",
                f"must be between {MIN_BENCH_CAPACITY} and {MAX_BENCH_CAPACITY} (the "
                "concurrency bench measured a replica serving within its SLO), or absent",
            )
        )
    for field, value in _numbers(summary, "summary"):
        if field == "summary.capacity":
            continue  # said above, with its bounds
        if not math.isfinite(value):
            errors.append(SpecError(field, "must be a finite number"))
        elif abs(value) > MAX_SUMMARY_MAGNITUDE:
            errors.append(
                SpecError(
                    field,
                    f"must be between -{MAX_SUMMARY_MAGNITUDE} and {MAX_SUMMARY_MAGNITUDE} "
                    "(2**53), the numbers the log keeps exactly",
                )
            )
    return errors + _text_errors(summary, "summary")


def _text_errors(value: object, path: str) -> list[SpecError]:
    """What is wrong with the strings in ``value``: a key's under its parent's path. A
    summary is data, not one line of prose: tabs and line feeds may be in it."""
    if isinstance(value, str):
        return control_character_errors(path, value, allowed=LINES)
    if isinstance(value, Mapping):
        return [
            error
            for key, item in value.items()
            for error in control_character_errors(path, str(key), allowed=LINES)
            + _text_errors(item, f"{path}.{key}")
        ]
    if isinstance(value, list | tuple):
        return [e for i, item in enumerate(value) for e in _text_errors(item, f"{path}[{i}]")]
    return []


def _numbers(value: object, path: str) -> list[tuple[str, float]]:
    """The numbers in ``value`` (not booleans), each with its path. A summary arrives decoded
    from a body the admin API bounds in size and depth, so the recursion is bounded too."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [(path, value)]
    if isinstance(value, Mapping):
        return [n for key, item in value.items() for n in _numbers(item, f"{path}.{key}")]
    if isinstance(value, list | tuple):
        return [n for i, item in enumerate(value) for n in _numbers(item, f"{path}[{i}]")]
    return []


def tune(
    state: ClusterState,
    model_name: str,
    replica_id: str | None,
    routing: RoutingSettings,
    summary: Mapping[str, Any],
    revision: int | None = None,
) -> Change:
    """Record ``routing`` for the model, or for ``replica_id`` (an active replica of it).

    ``revision`` is the model's revision that bench measured (its replica's). Settings for
    the model are refused when it is at another revision now (a rollout, or a removal and a
    new declaration, came in while bench ran): they would route replicas of a revision
    nobody measured. A replica keeps its revision, so its own settings are always its."""
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
    if replica_id is None and revision is not None and revision != model.revision:
        errors.append(
            SpecError(
                "revision",
                f"bench measured revision {revision} of the model; it is at revision "
                f"{model.revision} now: bench a replica of revision {model.revision}",
            )
        )
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
