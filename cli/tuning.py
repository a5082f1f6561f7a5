"""Routing settings bench measured, applied through ``POST /admin/v1/models/{name}/tuning``
to a model or to one of its replicas."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from cli.arguments import segment
from cli.client import AdminClient, decode


class Routing(msgspec.Struct, frozen=True, kw_only=True):
    weight: float
    target_waiting: int
    kv_ceiling: float


class TuningResult(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /admin/v1/models/{name}/tuning``'s answer."""

    changed: bool
    """False when these settings were already in force (nothing was recorded)."""
    model: str
    replica_id: str | None = None
    routing: Routing
    """The settings now in force for the model, or for the replica."""


_tuning_decoder = msgspec.json.Decoder(TuningResult)


def tune(
    client: AdminClient,
    model: str,
    *,
    weight: float,
    target_waiting: int,
    kv_ceiling: float,
    replica_id: str | None = None,
    summary: Mapping[str, object] | None = None,
    revision: int | None = None,
) -> TuningResult:
    """Apply routing settings (measured by bench) to ``model``, or to ``replica_id``
    alone; ``summary`` is kept with them in the log. With ``revision`` (the model's
    revision bench measured) the API refuses settings for a model now at another."""
    body = client.request(
        "POST",
        f"/admin/v1/models/{segment(model, 'the model name')}/tuning",
        body={
            "replica_id": replica_id,
            "weight": weight,
            "target_waiting": target_waiting,
            "kv_ceiling": kv_ceiling,
            "summary": dict(summary or {}),
            "revision": revision,
        },
    )
    return decode(_tuning_decoder, body, "tuning result")
