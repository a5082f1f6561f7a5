"""What an operator declares about a model, and the checks that keep a bad spec out of the log.

A spec is a value: it is carried whole by `ModelDeclared`, so the log alone says what was
asked for at any point in time.

Its parts and their checks have modules of their own: the bounds its parts share
(``spec_bounds``), its command and environment (``engine_command``), the engine's port and
flags given twice (``engine_flags``), its node selector (``node_selector``), its routing
settings (``routing_settings``), rollout policy (``rollout_policy``) and autoscaling policy
(``autoscale_policy``). This module holds the
spec itself and ``validate_spec``, which checks it whole, and names everything those
modules export, so that a caller reads every part of a spec from here.
"""

from __future__ import annotations

import re
from collections import Counter

import msgspec

from app.domain.autoscale_policy import (
    MAX_AUTOSCALE_TARGET,
    MAX_AUTOSCALE_WINDOW_S,
    MAX_COLD_START_S,
    MIN_AUTOSCALE_CAPACITY,
    MIN_AUTOSCALE_TARGET,
    AutoscalePolicy,
    autoscale_policy_errors,
)
from app.domain.engine_command import (
    AGENT_SET_VARIABLES,
    COMMAND_PLACEHOLDERS,
    MAX_AGENT_MESSAGE_BYTES,
    MAX_COMMAND_BYTES,
    MAX_ENV_ERRORS,
    command_errors,
    environment_errors,
    start_command_errors,
)
from app.domain.engine_flags import engine_flag_errors
from app.domain.node_selector import (
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_SELECTOR_LABELS,
    node_selector_errors,
)
from app.domain.rollout_policy import (
    ALL,
    DEFAULT_MIN_LATENCY_SAMPLES,
    MAX_CANARY_STEPS,
    MAX_HOLD_S,
    MAX_LATENCY_RATIO,
    MAX_MIN_LATENCY_SAMPLES,
    MAX_MIN_REQUESTS,
    MAX_ROLLOUT_FAILURES,
    MAX_STABILITY_WINDOW_S,
    CanaryStep,
    RolloutPolicy,
    rollout_policy_errors,
)
from app.domain.routing_settings import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_PREFIX_BYTES,
    DEFAULT_ROUTING_POLICY,
    MAX_IN_FLIGHT,
    MAX_LOAD_FACTOR,
    MAX_PREFIX_BYTES,
    MAX_TARGET_WAITING,
    MAX_WEIGHT,
    MIN_LOAD_FACTOR,
    MIN_PREFIX_BYTES,
    MIN_WEIGHT,
    ROUTING_POLICIES,
    SESSION_KEY_SOURCES,
    RoutingPolicy,
    RoutingSettings,
    SessionKeySource,
    routing_setting_errors,
)
from app.domain.shard_report_budget import MAX_SHARD_REPORT_BYTES, shard_report_refusal
from app.domain.spec_bounds import (
    DEFAULT_STARTUP_TIMEOUT_S,
    MAX_GPU_MEMORY_GIB,
    MAX_GPUS_PER_SHARD,
    MAX_MOVES,
    MAX_REPLICAS,
    MAX_SHARDS_PER_REPLICA,
    MAX_STARTUP_TIMEOUT_S,
    MAX_STOP_GRACE_S,
)
from app.domain.spec_error import SpecError, need_into
from app.domain.spec_secrets import secret_errors

__all__ = [
    "AGENT_SET_VARIABLES",
    "ALL",
    "API_NAMES",
    "COMMAND_PLACEHOLDERS",
    "DEFAULT_APIS",
    "DEFAULT_LOAD_FACTOR",
    "DEFAULT_MIN_LATENCY_SAMPLES",
    "DEFAULT_PREFIX_BYTES",
    "DEFAULT_ROUTING_POLICY",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "ENGINES",
    "MAX_AGENT_MESSAGE_BYTES",
    "MAX_AUTOSCALE_TARGET",
    "MAX_AUTOSCALE_WINDOW_S",
    "MAX_CANARY_STEPS",
    "MAX_COLD_START_S",
    "MAX_COMMAND_BYTES",
    "MAX_ENV_ERRORS",
    "MAX_GPUS_PER_SHARD",
    "MAX_GPU_MEMORY_GIB",
    "MAX_HOLD_S",
    "MAX_IN_FLIGHT",
    "MAX_LABEL_KEY_CHARS",
    "MAX_LABEL_VALUE_CHARS",
    "MAX_LATENCY_RATIO",
    "MAX_LOAD_FACTOR",
    "MAX_MIN_LATENCY_SAMPLES",
    "MAX_MIN_REQUESTS",
    "MAX_MOVES",
    "MAX_PREFIX_BYTES",
    "MAX_REPLICAS",
    "MAX_ROLLOUT_FAILURES",
    "MAX_SELECTOR_LABELS",
    "MAX_SHARDS_PER_REPLICA",
    "MAX_SHARD_REPORT_BYTES",
    "MAX_SPEC_BYTES",
    "MAX_STABILITY_WINDOW_S",
    "MAX_STARTUP_TIMEOUT_S",
    "MAX_STOP_GRACE_S",
    "MAX_TARGET_WAITING",
    "MAX_WEIGHT",
    "MIN_AUTOSCALE_CAPACITY",
    "MIN_AUTOSCALE_TARGET",
    "MIN_LOAD_FACTOR",
    "MIN_PREFIX_BYTES",
    "MIN_WEIGHT",
    "NAME_PATTERN",
    "NAME_RULE",
    "ROUTING_POLICIES",
    "SESSION_KEY_SOURCES",
    "AutoscalePolicy",
    "CanaryStep",
    "ModelSpec",
    "RolloutPolicy",
    "RoutingPolicy",
    "RoutingSettings",
    "SessionKeySource",
    "SpecError",
    "api_errors",
    "autoscale_policy_errors",
    "environment_errors",
    "name_errors",
    "node_selector_errors",
    "rollout_policy_errors",
    "routing_setting_errors",
    "validate_spec",
]

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
NAME_RULE = (
    "must be 1-63 lower-case letters, digits, '.', '_' or '-', "
    "starting and ending with a letter or digit"
)
ENGINES = ("vllm", "sglang", "llamacpp", "openai")
"""The engines llmgw has a profile for (``wire.engines.PROFILES``, kept equal by a test)."""
MAX_SPEC_BYTES = 64 * 1024
"""A whole spec as JSON, its environment included."""

API_NAMES = (
    "chat",
    "completions",
    "embeddings",
    "responses",
    "rerank",
    "score",
    "transcriptions",
    "translations",
    "tokenize",
)
"""The OpenAI-compatible APIs a model may serve through the gateway (docs/gateway.md names
the paths of each; ``tokenize`` is ``/v1/tokenize`` and ``/v1/detokenize``)."""
DEFAULT_APIS = ("chat", "completions")
"""What a spec that names no APIs serves: what every model served before specs named any."""


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
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    stop_grace_s: float = 30.0
    max_moves: int = 1
    routing: RoutingSettings = RoutingSettings()
    rollout: RolloutPolicy = RolloutPolicy()
    autoscale: AutoscalePolicy | None = None
    """None: the replica count is what an operator sets."""
    apis: tuple[str, ...] = DEFAULT_APIS
    """The APIs the gateway serves the model on (``API_NAMES``); any other is 404 for it."""


def name_errors(name: str) -> list[SpecError]:
    """What is wrong with ``name`` as a model's name: a spec's, or the one a path names."""
    return [] if NAME_PATTERN.fullmatch(name) else [SpecError("name", NAME_RULE)]


def validate_spec(spec: ModelSpec) -> list[SpecError]:
    """Every problem with `spec` (an empty list means it may be declared)."""
    errors: list[SpecError] = []
    need = need_into(errors)

    def need_between(value: float, field: str, low: float, high: float, note: str = "") -> None:
        # Written as a range to hold, so that NaN (which compares false) is refused too.
        need(low <= value <= high, field, f"must be between {low} and {high}{note}")

    errors.extend(name_errors(spec.name))
    errors.extend(command_errors(spec.command))
    spec_size = len(msgspec.json.encode(spec))
    need(
        spec_size <= MAX_SPEC_BYTES,
        "(spec)",
        f"is {spec_size} bytes as JSON, over the limit of {MAX_SPEC_BYTES}",
    )
    need(spec.engine in ENGINES, "engine", f"must be one of {', '.join(ENGINES)}")
    errors.extend(environment_errors(spec.env))
    errors.extend(secret_errors(spec.command, spec.env))
    errors.extend(node_selector_errors(spec.node_selector))
    need_between(spec.gpus_per_shard, "gpus_per_shard", 1, MAX_GPUS_PER_SHARD)
    need_between(spec.gpu_memory_gib, "gpu_memory_gib", 0, MAX_GPU_MEMORY_GIB)
    need_between(spec.shards_per_replica, "shards_per_replica", 1, MAX_SHARDS_PER_REPLICA)
    need_between(spec.replicas, "replicas", 0, MAX_REPLICAS)
    need(
        0 < spec.startup_timeout_s <= MAX_STARTUP_TIMEOUT_S,
        "startup_timeout_s",
        f"must be more than 0 and at most {MAX_STARTUP_TIMEOUT_S} (a day)",
    )
    need_between(spec.stop_grace_s, "stop_grace_s", 0, MAX_STOP_GRACE_S, " (an hour)")
    need_between(spec.max_moves, "max_moves", 1, MAX_MOVES)
    errors.extend(
        SpecError(f"routing.{e.field}", e.reason) for e in routing_setting_errors(spec.routing)
    )
    errors.extend(
        SpecError(f"rollout.{e.field}", e.reason) for e in rollout_policy_errors(spec.rollout)
    )
    errors.extend(held_step_count_errors(spec))
    if spec.autoscale is not None:
        errors.extend(
            SpecError(f"autoscale.{e.field}", e.reason)
            for e in autoscale_policy_errors(spec.autoscale)
        )
    errors.extend(SpecError("apis", reason) for reason in api_errors(spec.apis))
    if not errors:
        errors.extend(
            start_command_errors(
                model_name=spec.name,
                command=spec.command,
                env=spec.env,
                engine=spec.engine,
                gpus=spec.gpus_per_shard,
                shards=spec.shards_per_replica,
            )
        )
        errors.extend(engine_flag_errors(spec.command, spec.engine))
        errors.extend(_shard_report_errors(spec))
    return errors


def _shard_report_errors(spec: ModelSpec) -> list[SpecError]:
    """Every shard's report must fit its share of its node's hello, or the agent refuses
    to start it (``shard_report_budget``); the name is what makes it long."""
    refusal = shard_report_refusal(
        spec.name, spec.gpus_per_shard, spec.shards_per_replica, MAX_SHARD_REPORT_BYTES
    )
    return [] if refusal is None else [SpecError("name", refusal)]


def api_errors(apis: tuple[str, ...]) -> list[str]:
    """What is wrong with a spec's list of APIs, as reasons for the field ``apis``."""
    reasons = []
    if not apis:
        reasons.append(f"must name at least one API of {', '.join(API_NAMES)}")
    unknown = [api for api in apis if api not in API_NAMES]
    if unknown:
        shown = ", ".join(repr(api[:40]) for api in unknown[:5])
        reasons.append(f"names unknown API(s) {shown}; known: {', '.join(API_NAMES)}")
    counts = Counter(apis)
    repeated = [api for api in API_NAMES if counts[api] > 1]
    if repeated:
        reasons.append(f"names {', '.join(repeated)} more than once")
    return reasons


def held_step_count_errors(spec: ModelSpec) -> list[SpecError]:
    """A held step is judged against the model's replicas of the other revision: one that
    brings up as many replicas as the model can have leaves none, and every hold of it
    would end paused, its verdict never reached. Autoscaled, the count moves: only a step
    of at least ``max`` replicas can be known to leave none. A model of no replica has no
    rollout to judge."""
    policy = spec.autoscale
    most = spec.replicas if policy is None else policy.max_replicas
    whose = f"the model's {most} replica(s)" if policy is None else f"autoscale max ({most})"
    return [
        SpecError(
            f"rollout.steps[{i}].replicas",
            f"must be fewer than {whose} on a step with a hold: no replica of the other "
            "revision would be left to judge the step against",
        )
        for i, step in enumerate(spec.rollout.steps[:MAX_CANARY_STEPS])
        if isinstance(step.replicas, int) and step.hold_s > 0 and 1 <= most <= step.replicas
    ]
