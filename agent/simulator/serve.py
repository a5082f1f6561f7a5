"""The simulator's command line read into its settings, and the server run on them.

    run(["--port", "8001", "--max-num-seqs", "4"])     # serves until interrupted; 0

``LLMGW_SIM_<FLAG>`` in the environment gives a flag's value when the command line does
not; a value that does not parse, from either, ends the program with code 2 and says
which flag or variable it was.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, get_args

import structlog
import uvicorn

from agent.simulator.config import CapacityConfig, ErrorStyle, FaultConfig, ServerConfig
from agent.simulator.http_app import SimulatorApp
from agent.simulator.metrics import SimulatedProfile

FAILURE_EXIT_CODE = 3
ENV_PREFIX = "LLMGW_SIM_"
TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE_WORDS = frozenset({"0", "false", "f", "no", "n", "off"})
NONE_WORD = "none"
"""Given to a flag without a default (``--exit-after none``): not set, as if not given."""

log = structlog.get_logger("llmgw.sim")

_defaults = CapacityConfig()


def run(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    """Parse ``argv`` (and the environment) and serve; the process's exit code."""
    _configure_logging()
    parser = build_parser()
    try:
        parser.set_defaults(**defaults_from_environment(environ))
    except ValueError as exc:
        parser.error(str(exc))
    options = parser.parse_args(argv)
    try:
        capacity = CapacityConfig(
            max_num_seqs=options.max_num_seqs,
            block_size=options.block_size,
            num_blocks=options.num_blocks,
            prefill_ms_per_token=options.prefill_ms_per_token,
            decode_base_ms=options.decode_base_ms,
            decode_per_seq_ms=options.decode_per_seq_ms,
        )
    except ValueError as exc:
        log.error("invalid_capacity_settings", error=str(exc))
        return 2
    if options.eos_after is not None and options.eos_after < 1:
        log.error("invalid_eos_after", error="--eos-after must be at least 1")
        return 2
    config = ServerConfig(
        host=options.host,
        port=options.port,
        model=options.model,
        error_style=options.error_style,
        eos_after_tokens=options.eos_after,
        profile=options.profile,
        capacity=capacity.instant() if options.instant else capacity,
        faults=FaultConfig(
            start_delay_s=options.start_delay,
            never_ready=options.never_ready,
            exit_after_s=options.exit_after,
            crash_after_requests=options.crash_after_requests,
            without_metrics=options.without_metrics,
        ),
    )
    log.info(
        "simulator_starting",
        host=options.host,
        port=options.port,
        model=options.model,
        instant=options.instant,
        **{name: getattr(config.capacity, name) for name in config.capacity.__struct_fields__},
        start_delay=options.start_delay,
        never_ready=options.never_ready,
        exit_after=options.exit_after,
        crash_after_requests=options.crash_after_requests,
        without_metrics=options.without_metrics,
        eos_after=options.eos_after,
        error_style=options.error_style,
        profile=options.profile,
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES", ""),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            SimulatorApp(config, on_fatal=_exit_with_failure),
            host=options.host,
            port=options.port,
            lifespan="on",
            access_log=False,
            log_level="warning",
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=2,
        )
    )
    server.run()
    return 0


class Flag(NamedTuple):
    """One flag: its names, how its value is read (None: a switch, ``--x``/``--no-x``)."""

    names: tuple[str, ...]
    help: str
    read: Callable[[str], object] | None
    default: object = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.names[0].removeprefix("--").replace("-", "_")

    @property
    def variables(self) -> tuple[str, ...]:
        """``LLMGW_SIM_<FLAG>`` for each of its names (``--served-model-name`` too)."""
        return tuple(
            ENV_PREFIX + name.removeprefix("--").replace("-", "_").upper() for name in self.names
        )


FLAGS = (
    Flag(("--port",), "TCP port to listen on", int, 8000),
    Flag(("--host",), "address to listen on", str, "127.0.0.1"),
    Flag(
        ("--model", "--served-model-name"),
        "the model name the engine serves; requests for any other model get 404",
        str,
        "sim-model",
    ),
    Flag(
        ("--max-num-seqs",),
        "sequences that run at once; the others wait, first come first served",
        int,
        _defaults.max_num_seqs,
    ),
    Flag(("--block-size",), "tokens per KV-cache block", int, _defaults.block_size),
    Flag(("--num-blocks",), "KV-cache blocks in the whole cache", int, _defaults.num_blocks),
    Flag(
        ("--prefill-ms-per-token",),
        "prefill time per prompt token not found in the prefix cache",
        float,
        _defaults.prefill_ms_per_token,
    ),
    Flag(("--decode-base-ms",), "fixed part of one decode step", float, _defaults.decode_base_ms),
    Flag(
        ("--decode-per-seq-ms",),
        "part of one decode step added by each running sequence",
        float,
        _defaults.decode_per_seq_ms,
    ),
    Flag(("--instant",), "set every simulated time to zero", None, False),
    Flag(("--start-delay",), "seconds before /health answers 200 (503 until then)", float, 0.0),
    Flag(("--never-ready",), "/health answers 503 for ever", None, False),
    Flag(("--exit-after",), "exit with a failure this many seconds after start", float),
    Flag(
        ("--crash-after-requests",),
        "exit with a failure after serving this many completion requests",
        int,
    ),
    Flag(
        ("--without-metrics",),
        "/metrics answers 404, as an engine without a metrics exporter does",
        None,
        False,
    ),
    Flag(
        ("--eos-after",),
        "the model ends its answer after this many tokens (finish_reason stop) unless the "
        "request sets ignore_eos; by default answers run to max_tokens",
        int,
    ),
    Flag(
        ("--error-style",),
        'error bodies: openai ({"error": {...}}), flat ({"detail": ...}) or message '
        '({"object": "error", "message": ...})',
        str,
        "openai",
        get_args(ErrorStyle),
    ),
    Flag(
        ("--profile",),
        "whose metric names /metrics speaks: vllm, sglang or llamacpp (llama.cpp's server: "
        "no labels, no KV-cache gauge)",
        str,
        "vllm",
        get_args(SimulatedProfile),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-sim-engine",
        allow_abbrev=False,
        description="An OpenAI-compatible engine simulator with a capacity model and the "
        "metrics of vLLM, SGLang or llama.cpp's server. Every flag can also be set as "
        f"{ENV_PREFIX}<FLAG> in the environment ({ENV_PREFIX}MAX_NUM_SEQS=4, "
        f"{ENV_PREFIX}INSTANT=true); the command line wins.",
        epilog="Example: llmgw-sim-engine --port 8001 --model llama-sim --profile sglang",
    )
    for flag in FLAGS:
        shown = f"{flag.help} (default: %(default)s)" if flag.default is not None else flag.help
        if flag.read is None:
            parser.add_argument(
                *flag.names, *(f"--no-{name.removeprefix('--')}" for name in flag.names),
                dest=flag.dest, action=_Switch, default=flag.default, help=flag.help,
            )  # fmt: skip
        else:
            parser.add_argument(
                *flag.names, dest=flag.dest, type=_reader(flag), default=flag.default,
                choices=flag.choices, help=shown,
            )  # fmt: skip
    return parser


def defaults_from_environment(environ: Mapping[str, str]) -> dict[str, object]:
    """The flags ``LLMGW_SIM_<FLAG>`` sets, read as the flag would read them.

    Raises ValueError naming the variable when a value does not parse."""
    found: dict[str, object] = {}
    for flag in FLAGS:
        given = [name for name in flag.variables if name in environ]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are both set; set one")
        if not given:
            continue
        variable, text = given[0], environ[given[0]]
        try:
            found[flag.dest] = _read(flag, text)
        except ValueError as exc:
            raise ValueError(f"{variable}={text!r}: {exc}") from None
    return found


def _read(flag: Flag, text: str) -> object:
    if flag.read is None:
        return _switch_word(text)
    value = _reader(flag)(text)
    if flag.choices is not None and value not in flag.choices:
        raise ValueError(f"expected one of {', '.join(flag.choices)}")
    return value


def _switch_word(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS | FALSE_WORDS:
        return word in TRUE_WORDS
    raise ValueError("expected true or false")


def _reader(flag: Flag) -> Callable[[str], object]:
    """How a flag's value is read: a flag without a default also reads ``none``."""
    read = flag.read
    assert read is not None
    if flag.default is not None:
        return read

    def read_or_none(text: str) -> object:
        return None if text.strip().lower() == NONE_WORD else read(text)

    read_or_none.__name__ = read.__name__  # argparse names the type in its error
    return read_or_none


class _Switch(argparse.Action):
    """``--x`` and ``--no-x``, and ``--x=WORD`` / ``--no-x=WORD`` with a true or false word
    (``--instant=false`` is ``--no-instant``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        try:
            on = True if values is None else _switch_word(str(values))
        except ValueError as exc:
            raise argparse.ArgumentError(self, f"{values!r}: {exc}") from None
        negated = option_string is not None and option_string.startswith("--no-")
        setattr(namespace, self.dest, on != negated)


def _exit_with_failure(message: str) -> None:
    log.error("simulator_failing", reason=message)
    sys.stderr.flush()
    # A crashing engine does not drain its connections: end the process at once.
    os._exit(FAILURE_EXIT_CODE)


def _configure_logging() -> None:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.KeyValueRenderer(
                key_order=["timestamp", "level", "event"], drop_missing=True
            ),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
