"""What a bench is asked to do: the SLO, the workload and how the climb goes."""

from __future__ import annotations

from dataclasses import dataclass

from cli.bench.slo import SloTarget


@dataclass(frozen=True)
class BenchPlan:
    targets: tuple[SloTarget, ...]
    min_success_rate: float
    input_tokens: int
    output_tokens: int
    shared_prefix: bool = False
    warmup_s: float = 5.0
    duration_s: float = 30.0
    max_requests: int | None = None
    start_concurrency: int = 1
    max_concurrency: int = 512
    precision: float = 0.05
    sample_interval_s: float = 0.5
    request_timeout_s: float = 300.0
    seed: int | None = None

    @property
    def level_budget_s(self) -> float | None:
        """What one level is given: its warm-up and its measure window; ``None`` when it
        measures a count of requests, which takes as long as the engine needs. A level
        also waits for its last measured requests to end, so a slow engine can run over."""
        if self.max_requests is not None:
            return None
        return self.warmup_s + self.duration_s
