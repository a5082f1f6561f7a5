"""``llmgw-sim-engine``: start the engine simulator.

Every flag can also come from the environment as ``LLMGW_SIM_<FLAG>`` (``--max-num-seqs``
is ``LLMGW_SIM_MAX_NUM_SEQS``); a flag on the command line wins.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import cyclopts
import structlog
import uvicorn

from agent.simulator.config import CapacityConfig, ErrorStyle, FaultConfig, ServerConfig
from agent.simulator.http_app import SimulatorApp
from agent.simulator.metrics import SimulatedProfile

FAILURE_EXIT_CODE = 3

log = structlog.get_logger("llmgw.sim")

app = cyclopts.App(
    name="llmgw-sim-engine",
    help="An OpenAI-compatible engine simulator with a capacity model and the metrics of "
    "vLLM, SGLang or llama.cpp's server.",
    config=cyclopts.config.Env("LLMGW_SIM_"),
)

_defaults = CapacityConfig()


@app.default
def serve(
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    model: Annotated[str, cyclopts.Parameter(name=["--model", "--served-model-name"])] = (
        "sim-model"
    ),
    max_num_seqs: int = _defaults.max_num_seqs,
    block_size: int = _defaults.block_size,
    num_blocks: int = _defaults.num_blocks,
    prefill_ms_per_token: float = _defaults.prefill_ms_per_token,
    decode_base_ms: float = _defaults.decode_base_ms,
    decode_per_seq_ms: float = _defaults.decode_per_seq_ms,
    instant: bool = False,
    start_delay: float = 0.0,
    never_ready: bool = False,
    exit_after: float | None = None,
    crash_after_requests: int | None = None,
    without_metrics: bool = False,
    eos_after: int | None = None,
    error_style: ErrorStyle = "openai",
    profile: SimulatedProfile = "vllm",
) -> int:
    """Serve a simulated engine until interrupted.

    Parameters
    ----------
    port
        TCP port to listen on.
    host
        Address to listen on.
    model
        The model name the engine serves; requests for any other model get 404.
    max_num_seqs
        Sequences that run at once; the others wait, first come first served.
    block_size
        Tokens per KV-cache block.
    num_blocks
        KV-cache blocks in the whole cache.
    prefill_ms_per_token
        Prefill time per prompt token not found in the prefix cache.
    decode_base_ms
        Fixed part of one decode step.
    decode_per_seq_ms
        Part of one decode step added by each running sequence.
    instant
        Set every simulated time to zero.
    start_delay
        Seconds before /health answers 200 (503 until then).
    never_ready
        /health answers 503 for ever.
    exit_after
        Exit with a failure this many seconds after start.
    crash_after_requests
        Exit with a failure after serving this many completion requests.
    without_metrics
        /metrics answers 404, as an engine without a metrics exporter does.
    eos_after
        The model ends its answer after this many tokens (finish_reason "stop") unless
        the request sets ignore_eos. [default: answers run to max_tokens]
    error_style
        Error bodies: openai ({"error": {...}}), flat ({"detail": ...}) or message
        ({"object": "error", "message": ...}).
    profile
        Whose metric names /metrics speaks: vllm, sglang or llamacpp (llama.cpp's server:
        no labels, no KV-cache gauge).
    """
    try:
        capacity = CapacityConfig(
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            num_blocks=num_blocks,
            prefill_ms_per_token=prefill_ms_per_token,
            decode_base_ms=decode_base_ms,
            decode_per_seq_ms=decode_per_seq_ms,
        )
    except ValueError as exc:
        log.error("invalid_capacity_settings", error=str(exc))
        return 2
    if eos_after is not None and eos_after < 1:
        log.error("invalid_eos_after", error="--eos-after must be at least 1")
        return 2
    config = ServerConfig(
        host=host,
        port=port,
        model=model,
        error_style=error_style,
        eos_after_tokens=eos_after,
        profile=profile,
        capacity=capacity.instant() if instant else capacity,
        faults=FaultConfig(
            start_delay_s=start_delay,
            never_ready=never_ready,
            exit_after_s=exit_after,
            crash_after_requests=crash_after_requests,
            without_metrics=without_metrics,
        ),
    )
    log.info(
        "simulator_starting",
        host=host,
        port=port,
        model=model,
        instant=instant,
        **dict(_fields(config.capacity)),
        start_delay=start_delay,
        never_ready=never_ready,
        exit_after=exit_after,
        crash_after_requests=crash_after_requests,
        without_metrics=without_metrics,
        eos_after=eos_after,
        error_style=error_style,
        profile=profile,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            SimulatorApp(config, on_fatal=_exit_with_failure),
            host=host,
            port=port,
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


def _fields(capacity: CapacityConfig) -> list[tuple[str, object]]:
    return [(name, getattr(capacity, name)) for name in capacity.__struct_fields__]


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


def main() -> None:
    _configure_logging()
    result = app()
    sys.exit(result if isinstance(result, int) else 0)
