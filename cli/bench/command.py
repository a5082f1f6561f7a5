"""`llmgw-cli bench`: measure what one engine serves within a latency SLO, and recommend
its weight, target_waiting and kv_ceiling (``--apply`` records them).

Exit codes: 0 the climb ended (the capacity is known, or at least --max-concurrency);
1 failed (the engine unreachable or without /metrics, even concurrency 1 broke the SLO,
--apply with nothing to record or refused); 2 bad usage. A report is written whenever a
level ran, under ``$XDG_STATE_HOME/llmgw/bench/`` (else ``~/.local/state/llmgw/bench/``)
unless ``--report-dir`` says where.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from cyclopts import App, Group, Parameter

from app.regular_file import irregular_kind
from cli.arguments import (
    UsageError,
    WholeNumberWithin,
    filled,
    filled_path,
    segment,
    whole_number,
)
from cli.bench.errors import BenchError
from cli.bench.files import CHART_FILE, REPORT_FILE
from cli.bench.plan import BenchPlan
from cli.bench.slo import SloError, SloTarget, parse_duration, parse_fraction, parse_targets
from cli.bench.target import Target, engine_root, resolve_replica
from cli.client import AdminClient, ClientError
from cli.config import ConfigError, ConnectionFlags, ConnectionSettings, resolve_settings
from cli.render import EXIT_FAILED, EXIT_USAGE, print_error

bench_app = App(name="bench")

TARGET = Group("Target", sort_key=0)
SLO = Group("SLO", sort_key=1)
WORKLOAD = Group("Workload", sort_key=2)
CLIMB = Group("Climb", sort_key=3)
RESULT = Group("Report and apply", sort_key=4)
Positive = WholeNumberWithin(1)
MAX_CONCURRENCY = 100_000
"""The admin API's bound on a bench capacity (what the autoscaler scales by): a level above
it could not be applied, and each of its clients is a task and a connection of bench's own."""
Concurrency = WholeNumberWithin(1, MAX_CONCURRENCY)
MAX_TOKENS = 1_048_576
"""The most --input-tokens and --output-tokens take: the largest context window an engine
offers. Every prompt is built in memory and sent whole, so a slip of a few zeros would
otherwise fill bench's memory before the first request."""
Tokens = WholeNumberWithin(1, MAX_TOKENS)
_T = TypeVar("_T")


@dataclass(frozen=True)
class ClimbDefaults:
    """How long each level runs and how high the climb goes, unless flags say otherwise."""

    warmup: str
    duration: str
    max_concurrency: int


STANDARD = ClimbDefaults(warmup="5s", duration="30s", max_concurrency=256)
QUICK = ClimbDefaults(warmup="1s", duration="3s", max_concurrency=16)
"""At most 8 levels of 4s, 32s, which the simulator keeps within 40s."""


@bench_app.default
def bench(
    *,
    url: Annotated[
        str | None,
        Parameter(group=TARGET, help="An OpenAI-compatible engine: http://HOST:PORT or .../v1."),
    ] = None,
    replica: Annotated[
        str | None,
        Parameter(
            group=TARGET, help="A serving (or draining) replica, found through the admin API."
        ),
    ] = None,
    model: Annotated[
        str | None,
        Parameter(
            group=TARGET,
            converter=filled,
            help="The model id to request, when the engine serves several.",
        ),
    ] = None,
    api: Annotated[
        Literal["completions", "chat"],
        Parameter(group=TARGET, help="/v1/completions (the prompt first, as sent) or chat."),
    ] = "completions",
    slo: Annotated[
        tuple[str, ...],
        Parameter(
            group=SLO,
            negative=(),
            show_default=False,
            help="A latency target, LATENCY_pN=LIMIT: ttft, tpot or e2e; p50, p90, p95 or p99; "
            "such as ttft_p95=500ms. Repeat for several; at least one.",
        ),
    ] = (),
    min_success: Annotated[
        str, Parameter(group=SLO, help="Share of requests that must succeed at a level.")
    ] = "99%",
    input_tokens: Annotated[
        int,
        Parameter(
            group=WORKLOAD,
            converter=Tokens,
            help="Prompt length: words of about one token each (the simulator's exactly), "
            f"at most {MAX_TOKENS:,}.",
        ),
    ] = 512,
    output_tokens: Annotated[
        int,
        Parameter(
            group=WORKLOAD,
            converter=Tokens,
            help="Enforced with max_tokens, and ignore_eos where the engine takes it; at "
            f"most {MAX_TOKENS:,}.",
        ),
    ] = 128,
    shared_prefix: Annotated[
        bool,
        Parameter(
            group=WORKLOAD,
            negative=(),
            help="Send byte-identical prompts, to measure prefix caching on purpose. By "
            "default every prompt starts with a random header, so no cache can help.",
        ),
    ] = False,
    quick: Annotated[
        bool,
        Parameter(
            group=CLIMB,
            negative=(),
            help=f"A first look, in a minute or less: --warmup {QUICK.warmup} --duration "
            f"{QUICK.duration} --max-concurrency {QUICK.max_concurrency}, where not given. "
            "Its short levels are noisier: tune a production replica without it.",
        ),
    ] = False,
    warmup: Annotated[
        str | None,
        Parameter(
            group=CLIMB,
            help="Unmeasured start of each level. "
            f"[default: {STANDARD.warmup}; {QUICK.warmup} with --quick]",
        ),
    ] = None,
    duration: Annotated[
        str | None,
        Parameter(
            group=CLIMB,
            help="How long each level measures. "
            f"[default: {STANDARD.duration}; {QUICK.duration} with --quick]",
        ),
    ] = None,
    requests: Annotated[
        int | None,
        Parameter(
            group=CLIMB,
            converter=Positive,
            help="Measure this many requests instead.",
        ),
    ] = None,
    start_concurrency: Annotated[
        int,
        Parameter(
            group=CLIMB,
            converter=Concurrency,
            help=f"The first level to measure (at most {MAX_CONCURRENCY}).",
        ),
    ] = 1,
    max_concurrency: Annotated[
        int | None,
        Parameter(
            group=CLIMB,
            converter=Concurrency,
            help=f"The highest level to measure (at most {MAX_CONCURRENCY}). "
            f"[default: {STANDARD.max_concurrency}; {QUICK.max_concurrency} with --quick]",
        ),
    ] = None,
    precision: Annotated[
        str,
        Parameter(
            group=CLIMB,
            help="Stop bisecting when passing and failing levels are this close (a share of "
            "the passing level; never closer than 1).",
        ),
    ] = "5%",
    sample_interval: Annotated[
        str, Parameter(group=CLIMB, help="How often /metrics is read while a level measures.")
    ] = "500ms",
    request_timeout: Annotated[
        str,
        Parameter(
            group=CLIMB, help="How long one request may take; a slower one counts as failed."
        ),
    ] = "300s",
    seed: Annotated[
        int | None,
        Parameter(
            group=WORKLOAD, converter=whole_number, help="Make the random prompts reproducible."
        ),
    ] = None,
    report_dir: Annotated[
        Path | None,
        Parameter(
            group=RESULT,
            converter=filled_path,
            help="Where bench.json and bench.png go. "
            "[default: $XDG_STATE_HOME/llmgw/bench/NAME-TIME, else "
            "~/.local/state/llmgw/bench/NAME-TIME]",
        ),
    ] = None,
    output: Annotated[
        Literal["table", "wide", "json"],
        Parameter(
            group=RESULT,
            help="table for people (columns left out to fit the terminal, and said so); "
            "wide: every column; json prints the report's JSON.",
        ),
    ] = "table",
    apply: Annotated[
        bool,
        Parameter(
            group=RESULT,
            negative=(),
            help="Record the recommendation through the admin API (a tuned event with the "
            "bench summary). Nothing is recorded (exit 1) when --max-concurrency still met "
            "the SLO: the capacity was not reached. With --replica, refused for the model if "
            "it moved to another revision while bench ran.",
        ),
    ] = False,
    apply_to: Annotated[
        Literal["model", "replica"],
        Parameter(group=RESULT, help="Tune the whole model, or only --replica."),
    ] = "model",
    connection: ConnectionFlags | None = None,
) -> int:
    """Climb concurrency against one replica or engine until a latency SLO breaks; report
    its capacity and recommend weight, target_waiting and kv_ceiling.

    Concurrency climbs 1, 2, 4, ... until a level breaks the SLO, then bisects between the
    last level that met it (the capacity) and the first that broke it. Each level warms
    up, then measures TTFT, TPOT, end-to-end latency, throughput and errors, and samples
    the engine's waiting queue and KV-cache usage from /metrics. The prefix cache is reset
    between levels where the engine offers it.

    Before the first request it prints the levels it may measure and the most time they
    may take; as it runs, which level of how many, the time elapsed and the most left.
    With the defaults that is at most 14 levels of 35s: 8m10s. --quick takes a first look
    in a minute or less (at most 8 levels of 4s). The report goes under
    $XDG_STATE_HOME/llmgw/bench/ (else ~/.local/state/llmgw/bench/) or to --report-dir.

    ```
    llmgw-cli bench --replica llama-3-8b-2 --slo ttft_p95=500ms --quick
    llmgw-cli bench --replica llama-3-8b-2 --slo ttft_p95=500ms --slo tpot_p95=50ms
    llmgw-cli bench --url http://10.0.0.7:8001 --slo e2e_p99=10s --input-tokens 2000 --apply
    ```
    """
    defaults = QUICK if quick else STANDARD
    try:
        plan = BenchPlan(
            targets=_targets(slo),
            min_success_rate=parse_fraction(min_success, "--min-success"),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            shared_prefix=shared_prefix,
            warmup_s=parse_duration(_given(warmup, defaults.warmup), "--warmup"),
            duration_s=_positive(
                parse_duration(_given(duration, defaults.duration), "--duration"), "--duration"
            ),
            max_requests=requests,
            start_concurrency=start_concurrency,
            max_concurrency=_at_least(
                _given(max_concurrency, defaults.max_concurrency),
                start_concurrency,
                "--max-concurrency" if max_concurrency is not None or not quick else "--quick",
            ),
            precision=_precision(precision),
            sample_interval_s=_positive(
                parse_duration(sample_interval, "--sample-interval"), "--sample-interval"
            ),
            request_timeout_s=_positive(
                parse_duration(request_timeout, "--request-timeout"), "--request-timeout"
            ),
            seed=seed,
        )
        _check_target_flags(url, replica, apply_to)
        _check_report_dir(report_dir)
        settings = resolve_settings(connection or ConnectionFlags()) if replica or apply else None
        root_url = engine_root(url) if url is not None else None
    except (SloError, UsageError, ConfigError, ValueError) as exc:
        print_error("bench", str(exc))
        return EXIT_USAGE
    try:
        target = _target(root_url, replica, settings)
    except (ClientError, BenchError, UsageError) as exc:
        print_error("bench", str(exc))
        return EXIT_FAILED
    # aiohttp and matplotlib load only when a bench runs, so other commands start quickly.
    from cli.bench.execute import run_and_report

    return run_and_report(plan, target, model, api, report_dir, output, settings, apply, apply_to)


def _target(
    root_url: str | None, replica: str | None, settings: ConnectionSettings | None
) -> Target:
    if root_url is not None:
        return Target(root_url=root_url)
    if replica is None or settings is None:
        raise UsageError("give the engine to bench: --url URL or --replica ID")
    with AdminClient(settings) as client:
        return resolve_replica(client, replica)


def _check_target_flags(
    url: str | None, replica: str | None, apply_to: Literal["model", "replica"]
) -> None:
    if (url is None) == (replica is None):
        raise UsageError("give the engine to bench: --url URL or --replica ID (one of them)")
    if apply_to == "replica" and replica is None:
        # Refused with or without --apply: a replica's settings are only ever tuned for
        # a replica named, and a flag that could do nothing is a mistake to report.
        raise UsageError("--apply-to replica needs --replica")
    if replica is not None:
        segment(replica, "--replica")


def _check_report_dir(path: Path | None) -> None:
    """A ``UsageError`` unless the report can go to ``path``: a directory there, or a place
    one can be made. Checked before the climb, which takes minutes: the report was written
    only after it, so a file in the way ended the run in a traceback, its levels unreported."""
    if path is None:
        return
    existing = path
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--report-dir {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--report-dir {path}: {existing} is a directory bench cannot write in")
    for name in (REPORT_FILE, CHART_FILE):
        # Written over after the climb: a FIFO there would wait for a reader for ever, a
        # directory end the run in a traceback.
        kind = irregular_kind(os.stat(path / name).st_mode) if (path / name).exists() else None
        if kind is not None:
            raise UsageError(
                f"--report-dir {path}: {path / name}, which bench writes its report to, is "
                f"not a regular file but {kind}"
            )


def _targets(texts: tuple[str, ...]) -> tuple[SloTarget, ...]:
    if not texts:
        raise UsageError("give at least one latency target, such as --slo ttft_p95=500ms")
    return parse_targets(texts)


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _positive(value: float, flag: str) -> float:
    if value <= 0:
        raise UsageError(f"{flag} must be more than zero")
    return value


def _at_least(maximum: int, start: int, flag: str) -> int:
    if maximum < start:
        if flag == "--quick":
            raise UsageError(
                f"--quick climbs to concurrency {maximum}, below --start-concurrency {start}: "
                "give --max-concurrency too"
            )
        raise UsageError(f"--max-concurrency {maximum} is below --start-concurrency {start}")
    return maximum


def _precision(text: str) -> float:
    value = parse_fraction(text, "--precision")
    if value >= 1:
        raise UsageError("--precision must be below 100%")
    return value
