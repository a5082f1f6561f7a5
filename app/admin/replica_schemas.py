"""The admin API's views of replicas, their shards and traffic, and of a drain's progress
(wire schemas)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from app.admin.schemas import EventView


class ForgetEndedRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which ended replicas to forget: those that ended at or before ``before``, or more
    than ``older_than_s`` seconds ago (one of the two). The cutoff must be at least an hour
    ago."""

    before: datetime | None = None
    """A time with its UTC offset (``2026-11-01T00:00:00Z``)."""
    older_than_s: float | None = None
    """An age in seconds, before the server's clock (``2592000``: 30 days)."""


class EndedReplicasForgetting(msgspec.Struct, frozen=True, kw_only=True):
    """What a forgetting of ended replicas did: every replica that had ended by ``before``
    left the replica list and the projection tables; the log keeps their history."""

    before: datetime
    """The cutoff, in UTC."""
    forgotten: int
    """How many replicas were forgotten (none when none had ended by then)."""
    models: dict[str, int]
    """How many of each model's, for the models with any."""
    changed: bool
    """Whether anything was recorded (a request sent again with its idempotency key answers
    as the first did)."""


class ReplicaEjectionView(msgspec.Struct, frozen=True, kw_only=True):
    """How many live gateways keep a replica out of their rotation for failing requests
    in a row (docs/gateway.md#passive-health-ejection)."""

    ejected_by: int
    """Live gateways that eject it now (cooling off, or waiting for a probe to succeed)."""
    gateways: int
    """Live gateways that report ejections (those with a report of the last 5 s)."""


class ReplicaSummary(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    number: int
    phase: str
    nodes: list[str]
    placed_at: datetime
    serving_since: datetime | None
    routable: bool
    drain_id: str | None
    replaces: str | None
    replacement_id: str | None
    revision: int
    """The revision of its model it was placed with, and runs until it is replaced."""
    current_revision: int | None
    """Its model's revision now: greater than ``revision`` when the replica runs an older
    spec; null when its model is not known."""
    ejection: ReplicaEjectionView | None = None
    """How many live gateways eject it; null when no live gateway reports ejections (or
    the view does not say, as in a drain's)."""
    held_elsewhere_gpus: dict[str, list[int]] = {}
    """While it is active, each of its nodes with a GPU of its shards whose UUID another
    node, connected longer, lists too, and those GPUs' indexes; empty for most (and where
    the view does not say, as in a drain's)."""


class GpuHeldElsewhereView(msgspec.Struct, frozen=True, kw_only=True):
    """One of a shard's GPUs whose UUID another node, connected longer, lists too: two
    nodes claim one physical GPU, so the engine may not run where its node says. Nothing
    is stopped or moved for it (docs/gpus.md)."""

    index: int
    uuid: str
    held_by: str
    """The node, connected longer, that lists the UUID too."""
    reason: str
    """As the node's view says it: ``its UUID ... is listed by node gpu-07 too, connected
    longer``."""


class ShardView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    node_id: str
    gpus: list[int]
    port: int
    phase: str
    pid: int | None
    came_up: bool
    error: str | None
    exit_code: int | None
    log_tail: list[str]
    """The engine's last log lines, when the shard failed or was stopped before it was
    ever ready."""
    stop_reason: str | None = None
    """Why its agent stopped it of its own accord (``agent shutting down``), while it is
    stopped so; it starts again where it was placed once its node is back."""
    gpus_held_elsewhere: list[GpuHeldElsewhereView] = []
    """Its GPUs whose UUID another node holds, while the replica is active; empty for
    most."""


class ReplicaTrafficView(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateways saw of a replica's requests over their window, all added up
    (docs/gateway.md#what-the-gateway-measures)."""

    window_s: float
    """The gateways' sliding window: the last this many seconds (less at most a twelfth)."""
    gateways: int
    """Gateways with a fresh report, whether or not they sent the replica anything."""
    requests: int
    """Answered and failed requests; cancelled ones are not counted here."""
    errors: int
    """The engine's failures: a 5xx or 429, no answer, or an answer that broke off."""
    cancelled: int
    """Requests whose client went away first: not errors."""
    abandoned: int
    """Of ``cancelled``, those whose client went away before any of the answer came: a
    rollout's verdict counts them as failed (docs/rollouts.md#the-gateways-figures)."""
    error_rate: float | None
    """``errors / requests``, 0 to 1; null without requests."""
    ttft_p95_ms: float | None
    """Time to the first chunk of streamed 2xx answers, 95th percentile (within 4.4 %)."""
    ttft_samples: int
    tpot_p95_ms: float | None
    """Time per output token of finished streamed 2xx answers, 95th percentile."""
    tpot_samples: int
    latency_p95_ms: float | None
    """Time to the last byte of 2xx answers, streamed or not, 95th percentile."""
    latency_samples: int
    unlisted: int
    """Of ``gateways``, those whose report, past the replicas a report lists, left out
    replicas that may be these: the figures may lack requests those gateways sent them
    (docs/gateway.md#what-the-gateway-measures). 0 for most."""


class ReplicaView(ReplicaSummary, frozen=True, kw_only=True):
    reason: str
    starting_since: datetime | None
    drain_started_at: datetime | None
    stopping_since: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    shards: list[ShardView]
    traffic: ReplicaTrafficView | None = None
    """What the gateways measured of its requests; null when no gateway reports."""


class ReplicaRoomView(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a replica a node drain moves (or stops, not serving yet) has somewhere to go."""

    replica_id: str
    model: str
    has_room: bool
    """Whether placement finds a place for its replacement now, each replacement holding
    its GPUs for the next (or it has one already). Without room, it is stopped, not moved,
    when the grace runs out, unless room appears first."""
    reason: str | None = None
    """Why not, as placement says it (``llmgw-cli explain-placement MODEL``); null when it
    has room."""


class DrainAccepted(msgspec.Struct, frozen=True, kw_only=True):
    drain_id: str
    progress: str
    """Where to follow the drain."""
    grace_s: float | None = None
    """A node drain's grace; null for a replica drain."""
    room: list[ReplicaRoomView] = []
    """A node drain's replicas, by model and number, each with whether it has somewhere to
    go now, decided on the state the drain was recorded on; empty for a replica drain."""


class DrainProgressView(msgspec.Struct, frozen=True, kw_only=True):
    drain_id: str
    node_id: str | None
    requested_by: str
    requested_at: datetime
    grace_s: float | None
    grace_ends_at: datetime | None = None
    """When what is still on the node is stopped rather than moved; null for a replica
    drain."""
    state: Literal["running", "succeeded", "failed", "cancelled"]
    """``succeeded``: a node drain moved every replica, a replica drain's replicas were each
    replaced, or one that was not was stopped because its model had its count without it
    (a scale-down, a move an undo called off; the outcome names it); ``failed``: the grace
    ran out and what was left was stopped, or a replica being moved ended without a
    replacement otherwise (the outcome names it and why); ``cancelled``: an operator
    called it off (``POST /admin/v1/drains/{id}/cancel``; the outcome names who)."""
    finished: bool
    """Whether ``state`` is no longer ``running``."""
    outcome: str | None
    """What the drain came to, in words, for people; null while it runs."""
    replicas: list[ReplicaSummary]
    still_on_node: list[str]
    """The active replicas on the drained node that the drain is not moving off: those it
    has not reached yet and those whose move was called off; empty for a replica drain."""
    events: list[EventView]
    moves: list[MoveView] = []
    """Its moves under way: each original still serving and its replacement (once placed)."""
    moves_called_off: list[str] = []
    """Those of ``still_on_node`` whose move the drain began and called off (it was
    cancelled, say): listed in ``replicas`` too, and serving on the node."""


class DrainChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    """False when the drain was called off already: nothing was recorded."""
    drain: DrainProgressView
    """The drain's progress once the cancellation is recorded: a node drain runs until the
    reconciler's next pass has called off its moves."""


class MoveView(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    revision: int
    """The revision the original runs."""
    replacement_id: str | None
    replacement_phase: str | None
    waiting_for: str | None = None
    """Why no replacement is placed yet, as placement last said; null once one is placed."""
