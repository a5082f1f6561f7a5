"""The simulator's settings read from its command line (``agent.simulator.flags``), and the
server run on them.

    run(["--port", "8001", "--max-num-seqs", "4"])     # serves until interrupted; 0

Bad usage ends the program with code 2 and one line on stderr (``flags``); a port or host
it cannot listen on with code 1 and one line (``listening``), as every llmgw program that
cannot start; a fault it was told to show (``--exit-after``, ``--crash-after-requests``)
with code 3, the exit of the crashing engine it plays.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import structlog
import uvicorn

from agent.simulator.config import CapacityConfig, FaultConfig, ServerConfig
from agent.simulator.flags import PROGRAM, UsageError, parse, served_model
from agent.simulator.http_app import SimulatorApp
from agent.simulator.listening import ListenError, listening_sockets
from app.usage_words import shown

CANNOT_START_EXIT_CODE = 1
USAGE_EXIT_CODE = 2
FAILURE_EXIT_CODE = 3

log = structlog.get_logger("llmgw.sim")


def run(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    """Parse ``argv`` (and the environment) and serve; the process's exit code."""
    _configure_logging()
    try:
        options = parse(argv, environ)
        capacity = CapacityConfig(
            max_num_seqs=options.max_num_seqs,
            block_size=options.block_size,
            num_blocks=options.num_blocks,
            prefill_ms_per_token=options.prefill_ms_per_token,
            decode_base_ms=options.decode_base_ms,
            decode_per_seq_ms=options.decode_per_seq_ms,
        )
    except (UsageError, ValueError) as exc:
        print(shown(f"{PROGRAM}: {exc}"), file=sys.stderr, flush=True)
        return USAGE_EXIT_CODE
    try:
        sockets = listening_sockets(options.host, options.port)
    except ListenError as exc:
        print(shown(f"{PROGRAM}: {exc}"), file=sys.stderr, flush=True)
        return CANNOT_START_EXIT_CODE
    config = ServerConfig(
        host=options.host,
        port=options.port,
        model=served_model(options),
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
        served_model_name=config.model,
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
    server.run(sockets=sockets)
    return 0


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
