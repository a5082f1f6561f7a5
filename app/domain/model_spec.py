"""What an operator declares about a model, and the checks that keep a bad spec out of the log.

A spec is a value: it is carried whole by `ModelDeclared`, so the log alone says what was
asked for at any point in time.
"""

from __future__ import annotations

import re
import shlex
import string
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import msgspec

from app.domain.exec_limits import argv_refusal
from app.domain.shard_report_budget import MAX_SHARD_REPORT_BYTES, shard_report_refusal

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
ENGINES = ("vllm", "sglang", "llamacpp", "openai")
"""The engines llmgw has a profile for (``wire.engines.PROFILES``, kept equal by a test)."""

# Every number of a spec is bounded: far beyond any real value, well inside what the tables'
# columns hold and what a float writes exactly in the log's JSON (a weight of 1e308 is
# stored as 1 and 308 zeros, which no longer reads back as the float that was recorded).
MAX_GPUS_PER_SHARD = 64
"""The most GPUs a node may report (``wire.messages.MAX_GPUS_PER_NODE``, kept equal by a
test): a shard runs on one node, so one asking for more could never be placed."""
MAX_SHARDS_PER_REPLICA = 64
MAX_REPLICAS = 10_000
MAX_GPU_MEMORY_GIB = 1024
"""The most memory a node may report of one GPU (``app.hub.claims.MAX_GPU_MEMORY_MIB``, kept
equal by a test): a shard asking for more could never be placed."""
DEFAULT_STARTUP_TIMEOUT_S = 600.0
MAX_STARTUP_TIMEOUT_S = 86_400
"""A day: the largest models load in well under an hour."""
MAX_STOP_GRACE_S = 3_600
"""An hour; an agent refuses a ``stop_shard`` with more (``wire.messages.MAX_STOP_GRACE_S``)."""
MAX_MOVES = MAX_REPLICAS
MAX_SELECTOR_LABELS = 64
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 256
"""A node's labels, as its agent may report them (``wire.messages.Labels``, kept equal by a
test): a selector beyond them could never match a node."""
MIN_WEIGHT = 0.001
"""What ``llmgw-cli bench`` recommends at the least."""
MAX_WEIGHT = 1_000_000
MAX_TARGET_WAITING = 100_000
MAX_IN_FLIGHT = 100_000
"""Far above any engine's queue; the bound keeps the value inside the tables' integer."""
COMMAND_PLACEHOLDERS = frozenset(
    {"model", "port", "host", "gpus", "gpu_count", "rank", "world_size", "peers", "leader"}
)
MAX_COMMAND_BYTES = 16 * 1024
"""An engine command template: a long one, with an inline chat template, is a few KiB."""
MAX_SPEC_BYTES = 64 * 1024
"""A whole spec as JSON, its environment included."""
MAX_AGENT_MESSAGE_BYTES = 1024 * 1024
"""The agent channel's frame limit (``wire.messages.MAX_MESSAGE_BYTES``, kept equal
by a test): a shard's ``start_shard`` command must fit in one frame."""
_LONGEST_ADDRESS = "a" * 253
"""A node's address as placeholders render it, at its longest (a full DNS name)."""
_ENVELOPE_BYTES = 512
"""What a start_shard carries besides the spec's values: its type, ids, indexes, names."""


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


ALL: Literal["all"] = "all"
"""A canary step's ``replicas`` that means every replica of the model."""
MAX_CANARY_STEPS = 20
MAX_HOLD_S = 7 * 86_400
"""A week: a canary held longer than that is a second production, not a canary."""
MAX_STABILITY_WINDOW_S = 86_400
MAX_ROLLOUT_FAILURES = 1_000
MAX_MIN_REQUESTS = 1_000_000
MAX_MIN_LATENCY_SAMPLES = 1_000_000
DEFAULT_MIN_LATENCY_SAMPLES = 50
"""A p95 of fewer than 20 samples is their slowest, so one slow request decides it; of 50,
the third slowest: two stray requests on either side do not decide a verdict."""
MAX_LATENCY_RATIO = 100.0


class CanaryStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One step of a rollout: bring ``replicas`` of the new revision up (a number, or
    ``"all"``), send them ``traffic`` (a share of the model's requests, 0 to 1; None: their
    share by weight, as any replica), and hold ``hold_s`` seconds before the verdict."""

    replicas: int | Literal["all"]
    traffic: float | None = None
    hold_s: float = 0.0

    def count(self, desired: int) -> int:
        """How many replicas of the new revision the step brings up."""
        return desired if isinstance(self.replicas, str) else min(self.replicas, desired)


class RolloutPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a new revision replaces the running one (``docs/rollouts.md``).

    ``max_surge`` replicas of the new revision may run on top of the desired count while
    their originals still serve (each is a move); ``max_unavailable`` originals may stop
    before their replacement serves. ``stability_window_s``: how long a replacement serves
    before its original stops (None: the control plane's ``--stability-window``). ``steps``:
    canary steps; after the last one every remaining replica is replaced (an implicit
    ``{replicas: all}``). A step with a hold ends in a verdict, from the gateways'
    measurements of the new revision against the others: promote unless its error rate
    is more than ``max_error_rate_increase`` above theirs, or its TTFT, TPOT or latency
    p95 more than ``max_latency_ratio`` times theirs; with fewer than ``min_requests``
    requests on either side the verdict cannot be reached and the rollout pauses for an
    operator, unless the canary's errors alone put it above the allowed error rate at
    ``min_requests`` (it is rolled back), or the stable side saw too few and more than
    half of the canary's ``min_requests`` failed (it is rolled back too). A latency p95 is
    compared only once both sides have ``min_latency_samples`` samples of it; until then
    the verdict waits for them, and at the hold's end pauses as too few requests do. The
    gateways ejecting a replica of the new revision for failing (and none of the others)
    rolls it back. ``max_failures`` replicas of the new revision failing to start halt the
    rollout and roll it back."""

    max_surge: int = 1
    max_unavailable: int = 0
    stability_window_s: float | None = None
    steps: tuple[CanaryStep, ...] = ()
    max_failures: int = 2
    max_error_rate_increase: float = 0.01
    max_latency_ratio: float = 1.2
    min_requests: int = 20
    min_latency_samples: int = DEFAULT_MIN_LATENCY_SAMPLES

    @property
    def all_steps(self) -> tuple[CanaryStep, ...]:
        """The steps as they run: the implicit last step of every replica added."""
        if self.steps and self.steps[-1].replicas == ALL:
            return self.steps
        return (*self.steps, CanaryStep(replicas=ALL))


MIN_AUTOSCALE_TARGET = 0.01
"""The least a replica may be asked to carry: a hundredth of a request. Below it the count
the demand needs (demand / target) grows past any float and no longer rounds to a number."""
MAX_AUTOSCALE_TARGET = 100_000.0
MIN_AUTOSCALE_CAPACITY = 0.01
"""The least share of the benched capacity: a hundredth, for the same reason."""
MAX_AUTOSCALE_WINDOW_S = 86_400.0
MAX_COLD_START_S = 3_600.0


class AutoscalePolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replicas that follow demand (``docs/autoscaling.md``).

    Demand is the requests the gateways have in flight on the model's replicas plus those
    they hold queued for it. One replica should carry ``target`` of it, or, when ``capacity``
    is set and ``llmgw-cli bench`` measured the model, that share of the concurrency bench
    found it serves within its SLO. The count goes up as soon as the demand averaged over
    ``up_window_s`` needs more, down only after ``down_window_s`` in which the highest demand
    needed fewer (a drop to ``c`` of ``n`` replicas after ``max(down_window_min_share, c / n)``
    of it), by at most ``max_step`` replicas a decision, never outside ``[min, max]``. With
    ``min`` 0, a model without demand for ``idle_to_zero_s`` has none; a request for it is
    held by the gateway for up to ``cold_start_timeout_s`` while one starts."""

    min_replicas: int = msgspec.field(name="min", default=1)
    max_replicas: int = msgspec.field(name="max", default=1)
    target: float = 4.0
    capacity: float | None = None
    up_window_s: float = 10.0
    down_window_s: float = 300.0
    down_window_min_share: float = 1.0
    """The least share of ``down_window_s`` a scale-down waits: a drop from ``n`` replicas
    to ``c`` waits ``max(down_window_min_share, c / n)`` of the window, so that halving the
    count waits half of it. 1: every drop waits the whole window."""
    idle_to_zero_s: float = 900.0
    max_step: int = 4
    cold_start_timeout_s: float = 300.0


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

    def need_between(value: float, field: str, low: float, high: float, note: str = "") -> None:
        # Written as a range to hold, so that NaN (which compares false) is refused too.
        need(low <= value <= high, field, f"must be between {low} and {high}{note}")

    need(
        bool(NAME_PATTERN.fullmatch(spec.name)),
        "name",
        "must be 1-63 lower-case letters, digits, '.', '_' or '-', "
        "starting and ending with a letter or digit",
    )
    need(bool(spec.command.strip()), "command", "must not be empty")
    need(
        "\0" not in spec.command,
        "command",
        f"holds a NUL byte (character {spec.command.find(chr(0)) + 1}): {_NO_PROCESS}",
    )
    unknown = _unknown_placeholders(spec.command)
    need(
        not unknown,
        "command",
        f"unknown placeholder(s) {', '.join(sorted(unknown))}; "
        f"known: {', '.join(sorted(COMMAND_PLACEHOLDERS))}",
    )
    command_size = len(spec.command.encode())
    need(
        command_size <= MAX_COMMAND_BYTES,
        "command",
        f"is {command_size} bytes, over the limit of {MAX_COMMAND_BYTES}",
    )
    spec_size = len(msgspec.json.encode(spec))
    need(
        spec_size <= MAX_SPEC_BYTES,
        "(spec)",
        f"is {spec_size} bytes as JSON, over the limit of {MAX_SPEC_BYTES}",
    )
    need(spec.engine in ENGINES, "engine", f"must be one of {', '.join(ENGINES)}")
    errors.extend(environment_errors(spec.env))
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
    errors.extend(_held_step_count_errors(spec))
    if spec.autoscale is not None:
        errors.extend(
            SpecError(f"autoscale.{e.field}", e.reason)
            for e in autoscale_policy_errors(spec.autoscale)
        )
    errors.extend(SpecError("apis", reason) for reason in api_errors(spec.apis))
    if not errors:
        errors.extend(_start_command_errors(spec))
        errors.extend(_shard_report_errors(spec))
    return errors


def _shard_report_errors(spec: ModelSpec) -> list[SpecError]:
    """Every shard's report must fit its share of its node's hello, or the agent refuses
    to start it (``shard_report_budget``); the name is what makes it long."""
    refusal = shard_report_refusal(
        spec.name, spec.gpus_per_shard, spec.shards_per_replica, MAX_SHARD_REPORT_BYTES
    )
    return [] if refusal is None else [SpecError("name", refusal)]


_NO_PROCESS = "no process can be given one"
AGENT_SET_VARIABLES: Mapping[str, str] = MappingProxyType(
    {
        "CUDA_VISIBLE_DEVICES": "set by the agent from the GPUs it assigns",
        "PORT": "set by the agent to the port it assigns",
        "LLMGW_ENGINE_LAUNCH": "set by the agent to find its engine again after a restart",
    }
)
"""The variables the agent sets in every engine's environment over the spec's, and why: a
copy of ``wire.engine_env.AGENT_SET_VARIABLES`` (the domain imports no ``wire``), kept
equal to it by a test."""
MAX_ENV_ERRORS = 10


def environment_errors(env: dict[str, str]) -> list[SpecError]:
    """What no engine process can be given: a variable's name that is empty or holds '='
    or NUL, a value that holds NUL. Refused here rather than at every start of the
    replica on the agent (a NUL would even be recorded as U+FFFD: jsonb cannot hold one).
    A variable the agent sets itself (``AGENT_SET_VARIABLES``) is refused too: the agent
    would override it without a word.
    The first ``MAX_ENV_ERRORS`` are named, then how many more there are."""
    errors = []
    for name, value in env.items():
        named = f"holds a variable named {name[:64]!r}: a name cannot"
        if not name:
            errors.append(SpecError("env", f"{named} be empty"))
        elif "\0" in name:
            errors.append(SpecError("env", f"{named} hold a NUL byte ({_NO_PROCESS})"))
        elif "=" in name:
            before, _, after = name.partition("=")
            seen = f"{after}={value}"[:64]
            reason = f"{named} hold '=' (the engine would see {before[:64]} set to {seen!r})"
            errors.append(SpecError("env", reason))
        elif name in AGENT_SET_VARIABLES:
            errors.append(
                SpecError(f"env.{name}", f"is {AGENT_SET_VARIABLES[name]}; a spec cannot set it")
            )
        if "\0" in value:
            errors.append(SpecError(f"env.{name[:64]}", f"holds a NUL byte: {_NO_PROCESS}"))
    if len(errors) > MAX_ENV_ERRORS:
        more = len(errors) - MAX_ENV_ERRORS
        errors[MAX_ENV_ERRORS:] = [SpecError("env", f"and {more} more such problem(s)")]
    return errors


def node_selector_errors(selector: dict[str, str]) -> list[SpecError]:
    """A selector some node could match: within the labels an agent may report."""
    could_not = "so no node could match"
    if len(selector) > MAX_SELECTOR_LABELS:
        reason = f"has {len(selector)} labels: a node has at most {MAX_SELECTOR_LABELS}"
        return [SpecError("node_selector", f"{reason}, {could_not}")]
    errors = []
    for key, value in selector.items():
        if not 1 <= len(key) <= MAX_LABEL_KEY_CHARS:
            errors.append(
                SpecError(
                    "node_selector",
                    f"holds the key {key[:80]!r}: a node's label keys are "
                    f"1-{MAX_LABEL_KEY_CHARS} characters, {could_not}",
                )
            )
        elif len(value) > MAX_LABEL_VALUE_CHARS:
            errors.append(
                SpecError(
                    f"node_selector.{key}",
                    f"is {len(value)} characters: a node's label values are at most "
                    f"{MAX_LABEL_VALUE_CHARS}, {could_not}",
                )
            )
    return errors


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


def rollout_policy_errors(policy: RolloutPolicy) -> list[SpecError]:
    """What is wrong with a rollout policy, by the name of each field in ``policy``."""
    errors: list[SpecError] = []

    def need(ok: bool, field: str, reason: str) -> None:
        if not ok:
            errors.append(SpecError(field, reason))

    need(
        0 <= policy.max_surge <= MAX_REPLICAS, "max_surge", f"must be between 0 and {MAX_REPLICAS}"
    )
    need(
        0 <= policy.max_unavailable <= MAX_REPLICAS,
        "max_unavailable",
        f"must be between 0 and {MAX_REPLICAS}",
    )
    need(
        policy.max_surge > 0 or policy.max_unavailable > 0,
        "max_surge",
        "and max_unavailable cannot both be 0: nothing could ever be replaced",
    )
    window = policy.stability_window_s
    need(
        window is None or 0 <= window <= MAX_STABILITY_WINDOW_S,
        "stability_window_s",
        f"must be between 0 and {MAX_STABILITY_WINDOW_S} (a day), or absent",
    )
    need(
        1 <= policy.max_failures <= MAX_ROLLOUT_FAILURES,
        "max_failures",
        f"must be between 1 and {MAX_ROLLOUT_FAILURES}",
    )
    need(
        0 <= policy.max_error_rate_increase <= 1,
        "max_error_rate_increase",
        "must be between 0 and 1 (a share of requests: 0.01 is one point)",
    )
    need(
        1 <= policy.max_latency_ratio <= MAX_LATENCY_RATIO,
        "max_latency_ratio",
        f"must be between 1 and {MAX_LATENCY_RATIO:g}",
    )
    need(
        1 <= policy.min_requests <= MAX_MIN_REQUESTS,
        "min_requests",
        f"must be between 1 and {MAX_MIN_REQUESTS}",
    )
    need(
        1 <= policy.min_latency_samples <= MAX_MIN_LATENCY_SAMPLES,
        "min_latency_samples",
        f"must be between 1 and {MAX_MIN_LATENCY_SAMPLES}",
    )
    need(
        len(policy.steps) <= MAX_CANARY_STEPS,
        "steps",
        f"has {len(policy.steps)} steps, more than {MAX_CANARY_STEPS}",
    )
    previous = 0
    for i, step in enumerate(policy.steps[:MAX_CANARY_STEPS]):
        field = f"steps[{i}]"
        if isinstance(step.replicas, int):
            count = step.replicas
            need(
                1 <= count <= MAX_REPLICAS,
                f"{field}.replicas",
                f'must be between 1 and {MAX_REPLICAS}, or "all"',
            )
            need(
                count > previous,
                f"{field}.replicas",
                "must be more than the step before: a rollout only goes forward",
            )
            previous = count
        else:
            need(i == len(policy.steps) - 1, f"{field}.replicas", '"all" must be the last step')
        need(
            step.traffic is None or 0 < step.traffic <= 1,
            f"{field}.traffic",
            "must be in (0, 1] (a share of the model's requests), or absent",
        )
        need(
            step.traffic is None or step.replicas != ALL,
            f"{field}.traffic",
            'cannot be set on a step of "all" replicas: there is no other revision left',
        )
        need(
            0 <= step.hold_s <= MAX_HOLD_S,
            f"{field}.hold_s",
            f"must be between 0 and {MAX_HOLD_S} (a week)",
        )
        need(
            not (step.hold_s > 0 and step.traffic == 1),
            f"{field}.traffic",
            "cannot be 1 on a step with a hold: the other revision would see no request to "
            "judge the step against",
        )
    return errors


def _held_step_count_errors(spec: ModelSpec) -> list[SpecError]:
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


def autoscale_policy_errors(policy: AutoscalePolicy) -> list[SpecError]:
    """What is wrong with an autoscaling policy, by the name of each field as written."""
    errors: list[SpecError] = []

    def need(ok: bool, field: str, reason: str) -> None:
        if not ok:
            errors.append(SpecError(field, reason))

    low, high = policy.min_replicas, policy.max_replicas
    need(0 <= low <= MAX_REPLICAS, "min", f"must be between 0 and {MAX_REPLICAS}")
    need(1 <= high <= MAX_REPLICAS, "max", f"must be between 1 and {MAX_REPLICAS}")
    need(low <= high, "max", f"must be at least min ({low})")
    need(
        MIN_AUTOSCALE_TARGET <= policy.target <= MAX_AUTOSCALE_TARGET,
        "target",
        f"must be between {MIN_AUTOSCALE_TARGET:g} and {MAX_AUTOSCALE_TARGET:g} "
        "(requests a replica carries)",
    )
    need(
        policy.capacity is None or MIN_AUTOSCALE_CAPACITY <= policy.capacity <= 1,
        "capacity",
        f"must be between {MIN_AUTOSCALE_CAPACITY:g} and 1 (a share of the capacity bench "
        "measured), or absent",
    )
    for field, value in (
        ("up_window_s", policy.up_window_s),
        ("down_window_s", policy.down_window_s),
        ("idle_to_zero_s", policy.idle_to_zero_s),
    ):
        need(
            0 <= value <= MAX_AUTOSCALE_WINDOW_S,
            field,
            f"must be between 0 and {MAX_AUTOSCALE_WINDOW_S:g} (a day)",
        )
    need(
        0 < policy.down_window_min_share <= 1,
        "down_window_min_share",
        "must be in (0, 1] (the least share of down_window_s a scale-down waits)",
    )
    need(1 <= policy.max_step <= MAX_REPLICAS, "max_step", f"must be between 1 and {MAX_REPLICAS}")
    need(
        0 < policy.cold_start_timeout_s <= MAX_COLD_START_S,
        "cold_start_timeout_s",
        f"must be more than 0 and at most {MAX_COLD_START_S:g} (an hour)",
    )
    return errors


def _start_command_errors(spec: ModelSpec) -> list[SpecError]:
    """The command line must split into words that the kernel can start (``exec_limits``),
    and the ``start_shard`` command of a shard must fit in one agent frame, even with the
    longest values its placeholders can take: otherwise every start of the replica would
    fail while it holds its GPUs."""
    shards = spec.shards_per_replica
    endpoint = f"{_LONGEST_ADDRESS}:65535"
    values = {
        "model": spec.name,
        "port": "65535",
        "host": _LONGEST_ADDRESS,
        "gpus": ",".join(["99"] * spec.gpus_per_shard),
        "gpu_count": str(spec.gpus_per_shard),
        "rank": str(shards - 1),
        "world_size": str(shards),
        "peers": ",".join([endpoint] * (shards - 1)),
        "leader": endpoint,
    }
    try:
        # Split before filling in (the values hold no spaces or quotes, so the words are
        # the same): splitting is slow, and a few KiB of {peers} fill in to megabytes.
        words = shlex.split(spec.command)
    except ValueError as exc:
        return [SpecError("command", f"cannot be split into words: {exc}")]
    size = _ENVELOPE_BYTES + sum(
        len(literal) + (len(values[name]) if name else 0)
        for literal, name, _, _ in string.Formatter().parse(spec.command)
    )
    bound = "at least"
    if size <= MAX_AGENT_MESSAGE_BYTES:
        bound = "up to"
        argv = [word.format(**values) for word in words]
        refusal = argv_refusal(argv)
        if refusal is not None:
            return [SpecError("command", refusal)]
        peer = {"shard_index": 63, "address": _LONGEST_ADDRESS, "port": 65535}
        command = {
            "argv": argv,
            "env": spec.env,
            "gpus": [99] * spec.gpus_per_shard,
            "peers": [peer] * (shards - 1),
            "engine": spec.engine,
        }
        size = _ENVELOPE_BYTES + len(msgspec.json.encode(command))
    if size <= MAX_AGENT_MESSAGE_BYTES:
        return []
    return [
        SpecError(
            "command",
            f"makes a start_shard command of {bound} {size} bytes (placeholders filled in), "
            f"over the agent channel's limit of {MAX_AGENT_MESSAGE_BYTES} bytes",
        )
    ]


def _unknown_placeholders(template: str) -> set[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return {"<unbalanced braces>"}
    unknown = {name for _, name, _, _ in parsed if name} - COMMAND_PLACEHOLDERS
    for _, name, format_spec, conversion in parsed:
        if name is None:
            continue
        # Only plain {name}: {} has no value, and a format spec such as {port:>999999999}
        # would render a gigabyte of padding.
        if not name or format_spec or conversion:
            shown = name + (f"!{conversion}" if conversion else "")
            unknown.add("{" + shown + (f":{format_spec}" if format_spec else "") + "}")
    return unknown
