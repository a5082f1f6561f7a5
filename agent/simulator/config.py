"""Settings of the simulated engine: its capacity and the faults it can be told to show."""

from __future__ import annotations

from typing import Literal

import msgspec

from agent.simulator.metrics import SimulatedProfile

ErrorStyle = Literal["openai", "flat", "message"]


class CapacityConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What one simulated engine can hold and how long its work takes.

    Times are in milliseconds, as engines usually quote them.
    """

    max_num_seqs: int = 64
    block_size: int = 16
    num_blocks: int = 2048
    prefill_ms_per_token: float = 0.1
    decode_base_ms: float = 8.0
    decode_per_seq_ms: float = 0.1

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.block_size < 1 or self.num_blocks < 1:
            raise ValueError("max_num_seqs, block_size and num_blocks must be at least 1")
        if min(self.prefill_ms_per_token, self.decode_base_ms, self.decode_per_seq_ms) < 0:
            raise ValueError("simulated times cannot be negative")

    def instant(self) -> CapacityConfig:
        """The same capacity with every simulated time set to zero."""
        return msgspec.structs.replace(
            self, prefill_ms_per_token=0.0, decode_base_ms=0.0, decode_per_seq_ms=0.0
        )

    def decode_step_ms(self, batch_size: int) -> float:
        return self.decode_base_ms + self.decode_per_seq_ms * batch_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


class FaultConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Failures to show on purpose, so supervisors and gateways can be tested against them."""

    start_delay_s: float = 0.0
    never_ready: bool = False
    exit_after_s: float | None = None
    crash_after_requests: int | None = None
    without_metrics: bool = False
    """``/metrics`` answers 404, as an engine that exports no metrics does."""


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-model"
    error_style: ErrorStyle = "openai"
    eos_after_tokens: int | None = None
    """The simulated model emits its end-of-sequence token after this many output tokens;
    ``None``: never, every answer runs to ``max_tokens``."""
    capacity: CapacityConfig = CapacityConfig()
    faults: FaultConfig = FaultConfig()
    profile: SimulatedProfile = "vllm"
    """Whose metric names ``/metrics`` speaks (``agent.simulator.metrics``)."""
