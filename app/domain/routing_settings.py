"""How the gateway treats a model's replicas (``ModelSpec.routing``), and its checks."""

from __future__ import annotations

from typing import Literal

import msgspec

from app.domain.spec_error import SpecError

MIN_WEIGHT = 0.001
"""What ``llmgw-cli bench`` recommends at the least."""
MAX_WEIGHT = 1_000_000
MAX_TARGET_WAITING = 100_000
MAX_IN_FLIGHT = 100_000
"""Far above any engine's queue; the bound keeps the value inside the tables' integer."""

RoutingPolicy = Literal["least_loaded", "prefix", "session"]
"""How a gateway picks among a model's eligible replicas (``docs/gateway-routing.md``):
``least_loaded`` by load and weight alone; ``prefix`` by weighted rendezvous hashing of the
request's leading content with bounded loads; ``session`` likewise by its session key, or
by its leading content when it carries none."""
ROUTING_POLICIES: tuple[RoutingPolicy, ...] = ("least_loaded", "prefix", "session")
SessionKeySource = Literal["header", "prompt_cache_key", "user"]
"""Where a session key is read: the ``x-session-id`` header, or the OpenAI body fields
``prompt_cache_key`` / ``user``."""
SESSION_KEY_SOURCES: tuple[SessionKeySource, ...] = ("header", "prompt_cache_key", "user")
DEFAULT_ROUTING_POLICY: RoutingPolicy = "least_loaded"
DEFAULT_LOAD_FACTOR = 0.25
MIN_LOAD_FACTOR = 0.01
MAX_LOAD_FACTOR = 10.0
DEFAULT_PREFIX_BYTES = 1024
MIN_PREFIX_BYTES = 16
MAX_PREFIX_BYTES = 65_536


class RoutingSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the gateway treats a replica: share of traffic and when it counts as saturated;
    and how it picks among a model's replicas (the last five: per model only)."""

    weight: float = 1.0
    target_waiting: int = 5
    kv_ceiling: float = 0.8
    policy: RoutingPolicy = DEFAULT_ROUTING_POLICY
    load_factor: float = DEFAULT_LOAD_FACTOR
    """The bound's epsilon: a replica carrying more than ``(1 + load_factor)`` times its
    share of the requests in flight is passed over (``prefix`` and ``session``)."""
    prefix_bytes: int = DEFAULT_PREFIX_BYTES
    """The key's length: how many leading bytes of each leading message (or of a prompt)
    make the prefix key."""
    session_keys: tuple[SessionKeySource, ...] = SESSION_KEY_SOURCES
    """Where the session key is read, first found first (``session``)."""
    max_in_flight: int | None = None
    """The most requests one gateway sends one replica at once; more wait in the gateway's
    queue (fair across keys) and go to the first replica with room, a replica that starts
    serving among them. ``None``: no bound beyond admission's (``target_waiting``)."""


def routing_setting_errors(routing: RoutingSettings) -> list[SpecError]:
    """What is wrong with routing settings, by the name of each field in ``routing``."""
    errors = []
    if not MIN_WEIGHT <= routing.weight <= MAX_WEIGHT:
        errors.append(SpecError("weight", f"must be between {MIN_WEIGHT:g} and {MAX_WEIGHT}"))
    if not 1 <= routing.target_waiting <= MAX_TARGET_WAITING:
        errors.append(SpecError("target_waiting", f"must be between 1 and {MAX_TARGET_WAITING}"))
    # Any positive share: bench sets it to the highest KV usage it saw, however small.
    if not 0 < routing.kv_ceiling <= 1:
        errors.append(SpecError("kv_ceiling", "must be in (0, 1]"))
    if routing.policy not in ROUTING_POLICIES:
        errors.append(SpecError("policy", f"must be one of {', '.join(ROUTING_POLICIES)}"))
    if not MIN_LOAD_FACTOR <= routing.load_factor <= MAX_LOAD_FACTOR:
        errors.append(
            SpecError(
                "load_factor",
                f"must be between {MIN_LOAD_FACTOR:g} and {MAX_LOAD_FACTOR:g} (0.25: a replica "
                "takes up to 1.25 times its share of the requests in flight)",
            )
        )
    if not MIN_PREFIX_BYTES <= routing.prefix_bytes <= MAX_PREFIX_BYTES:
        errors.append(
            SpecError("prefix_bytes", f"must be between {MIN_PREFIX_BYTES} and {MAX_PREFIX_BYTES}")
        )
    if routing.max_in_flight is not None and not 1 <= routing.max_in_flight <= MAX_IN_FLIGHT:
        errors.append(
            SpecError(
                "max_in_flight",
                f"must be between 1 and {MAX_IN_FLIGHT} (the sequences one replica runs at "
                "once), or null for no bound",
            )
        )
    unknown = [s for s in routing.session_keys if s not in SESSION_KEY_SOURCES]
    if unknown:
        errors.append(SpecError("session_keys", f"may hold only {', '.join(SESSION_KEY_SOURCES)}"))
    elif len(set(routing.session_keys)) != len(routing.session_keys):
        errors.append(SpecError("session_keys", "names a source twice"))
    return errors
