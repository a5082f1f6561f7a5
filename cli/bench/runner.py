"""The climb against a live engine: connect, check one request of the run's shape, then
measure level after level until the climb ends.

``BenchRun`` holds what was found so far, so whoever called ``run_bench`` can report the
levels that ran when the engine fails half way, or the operator interrupts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from cli.bench.climb import Climb
from cli.bench.load import ClosedLoop
from cli.bench.metrics import EngineReading
from cli.bench.plan import BenchPlan
from cli.bench.probe import PrefixCacheReset, check_shape, connect
from cli.bench.prompts import PromptSource
from cli.bench.request import engine_session
from cli.bench.sampler import MetricsReader, sample_while_measuring
from cli.bench.slo import breaches
from cli.bench.stats import LevelFigures, summarize
from cli.bench.target import Api, Engine

PROGRESS_INTERVAL_S = 0.1


class Observer(Protocol):
    """Told how the bench goes, to show progress."""

    def level_started(self, load: ClosedLoop) -> None: ...

    def level_progress(self, load: ClosedLoop) -> None: ...

    def level_finished(self, figures: LevelFigures) -> None:
        """Once the level is recorded in the run and its climb."""


@dataclass
class BenchRun:
    plan: BenchPlan
    climb: Climb
    engine: Engine | None = None
    levels: list[LevelFigures] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cache_reset: str | None = None
    """The route that reset the prefix cache between levels; ``None`` when none did."""

    @classmethod
    def planned(cls, plan: BenchPlan) -> BenchRun:
        climb = Climb(
            start=plan.start_concurrency, ceiling=plan.max_concurrency, precision=plan.precision
        )
        return cls(plan=plan, climb=climb)


async def run_bench(
    run: BenchRun, root_url: str, model: str | None, api: Api, observer: Observer
) -> None:
    """Fills ``run`` level by level. Raises ``BenchError`` subclasses."""
    plan = run.plan
    async with engine_session() as session:
        engine, notes = await connect(session, root_url, model, api)
        run.engine = engine
        run.notes.extend(notes)
        reader = MetricsReader(session, engine)
        await reader.check()
        reset_cache = PrefixCacheReset(session, engine.root_url)
        prompts = PromptSource(
            plan.input_tokens,
            shared_prefix=plan.shared_prefix,
            rng=random.Random(plan.seed) if plan.seed is not None else None,
        )
        await check_shape(
            session,
            engine,
            prompts.next_prompt(),
            plan.output_tokens,
            input_tokens=plan.input_tokens,
            timeout_s=plan.request_timeout_s,
        )
        while (level := run.climb.next_level) is not None:
            if await reset_cache():
                run.cache_reset = reset_cache.path
            load = ClosedLoop(
                session,
                engine,
                prompts,
                concurrency=level,
                output_tokens=plan.output_tokens,
                warmup_s=plan.warmup_s,
                duration_s=plan.duration_s,
                max_requests=plan.max_requests,
                request_timeout_s=plan.request_timeout_s,
            )
            figures = await _measure(load, reader, plan, observer)
            run.levels.append(figures)
            run.climb.record(level, passed=figures.slo_met)
            observer.level_finished(figures)
        if run.cache_reset is None:
            run.notes.append(
                "the engine offers no prefix-cache reset (/reset_prefix_cache, /flush_cache): "
                "levels may have reused what earlier ones cached"
            )


async def _measure(
    load: ClosedLoop, reader: MetricsReader, plan: BenchPlan, observer: Observer
) -> LevelFigures:
    before = await reader.read()
    samples: list[EngineReading] = []
    observer.level_started(load)
    helpers = [
        asyncio.create_task(sample_while_measuring(reader, load, plan.sample_interval_s, samples)),
        asyncio.create_task(_report_progress(load, observer)),
    ]
    try:
        result = await load.run()
    finally:
        for helper in helpers:
            helper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*helpers)
    after = await reader.read()
    figures = summarize(result, samples, before, after)
    missed = breaches(plan.targets, plan.min_success_rate, figures)
    return msgspec.structs.replace(figures, slo_met=not missed, breaches=missed)


async def _report_progress(load: ClosedLoop, observer: Observer) -> None:
    while True:
        observer.level_progress(load)
        await asyncio.sleep(PROGRESS_INTERVAL_S)
