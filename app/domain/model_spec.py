"""What an operator declares about a model, and the checks that keep a bad spec out of the log.

A spec is a value: it is carried whole by `ModelDeclared`, so the log alone says what was
asked for at any point in time.
"""

from __future__ import annotations

import re
import string

import msgspec

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
ENGINES = ("vllm", "sglang", "openai")
MAX_TARGET_WAITING = 100_000
"""Far above any engine's queue; the bound keeps the value inside the tables' integer."""
COMMAND_PLACEHOLDERS = frozenset(
    {"model", "port", "host", "gpus", "gpu_count", "rank", "world_size", "peers", "leader"}
)


class RoutingSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the gateway treats a replica: share of traffic and when it counts as saturated."""

    weight: float = 1.0
    target_waiting: int = 5
    kv_ceiling: float = 0.8


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A declared model. `command` is a template; see COMMAND_PLACEHOLDERS for its fields."""

    name: str
    command: str
    engine: str = "vllm"
    env: dict[str, str] = {}
    gpus_per_shard: int = 1
    gpu_memory_gib: float = 0.0
    shards_per_replica: int = 1
    node_selector: dict[str, str] = {}
    replicas: int = 1
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 30.0
    max_moves: int = 1
    routing: RoutingSettings = RoutingSettings()


class SpecError(msgspec.Struct, frozen=True):
    """One thing wrong with a spec: the field and why, in words an operator can act on."""

    field: str
    reason: str


def validate_spec(spec: ModelSpec) -> list[SpecError]:
    """Every problem with `spec` (an empty list means it may be declared)."""
    errors: list[SpecError] = []

    def need(ok: bool, field: str, reason: str) -> None:
        if not ok:
            errors.append(SpecError(field, reason))

    need(
        bool(NAME_PATTERN.match(spec.name)),
        "name",
        "must be 1-63 lower-case letters, digits, '.', '_' or '-', "
        "starting and ending with a letter or digit",
    )
    need(bool(spec.command.strip()), "command", "must not be empty")
    unknown = _unknown_placeholders(spec.command)
    need(
        not unknown,
        "command",
        f"unknown placeholder(s) {', '.join(sorted(unknown))}; "
        f"known: {', '.join(sorted(COMMAND_PLACEHOLDERS))}",
    )
    need(spec.engine in ENGINES, "engine", f"must be one of {', '.join(ENGINES)}")
    need(1 <= spec.gpus_per_shard <= 64, "gpus_per_shard", "must be between 1 and 64")
    need(spec.gpu_memory_gib >= 0, "gpu_memory_gib", "must not be negative")
    need(1 <= spec.shards_per_replica <= 64, "shards_per_replica", "must be between 1 and 64")
    need(0 <= spec.replicas <= 10_000, "replicas", "must be between 0 and 10000")
    need(spec.startup_timeout_s > 0, "startup_timeout_s", "must be positive")
    need(spec.stop_grace_s >= 0, "stop_grace_s", "must not be negative")
    need(spec.max_moves >= 1, "max_moves", "must be at least 1")
    need(spec.routing.weight > 0, "routing.weight", "must be positive")
    need(
        1 <= spec.routing.target_waiting <= MAX_TARGET_WAITING,
        "routing.target_waiting",
        f"must be between 1 and {MAX_TARGET_WAITING}",
    )
    need(0 < spec.routing.kv_ceiling <= 1, "routing.kv_ceiling", "must be in (0, 1]")
    return errors


def _unknown_placeholders(template: str) -> set[str]:
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    except ValueError:
        return {"<unbalanced braces>"}
    return fields - COMMAND_PLACEHOLDERS
