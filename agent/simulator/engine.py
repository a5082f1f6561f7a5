"""The asyncio shell around the capacity model: it steps the model in real time.

One task (``SimEngine.run``) loops: begin a step, sleep for its planned duration, end it,
and hand the new tokens to the requests waiting on them. Each HTTP request holds a
``RequestHandle`` and awaits progress on it; aborting the handle frees the request's slot
and KV blocks at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agent.simulator.capacity import CapacityModel, StepResult
from agent.simulator.config import CapacityConfig
from agent.simulator.metrics import EngineMetrics, GaugeReadings

ZERO_STEPS_PER_YIELD = 64
MAX_LAG_S = 0.05


class RequestHandle:
    """One request's view of its progress through the engine."""

    __slots__ = (
        "_waiter",
        "aborted",
        "finished",
        "generated",
        "max_tokens",
        "prompt_tokens",
        "request_id",
        "streaming",
    )

    def __init__(
        self, *, request_id: int, prompt_tokens: int, max_tokens: int, streaming: bool
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.generated = 0
        self.finished = False
        self.aborted = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self.finished or self.aborted

    async def wait_for_tokens(self, seen: int) -> int:
        """Wait until more than ``seen`` tokens exist or the request is done; return how
        many exist."""
        if self.generated <= seen and not self.done:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.generated

    async def wait_until_done(self) -> None:
        while not self.done:
            await self.wait_for_tokens(self.max_tokens)

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


class SimEngine:
    def __init__(self, config: CapacityConfig, metrics: EngineMetrics) -> None:
        self._model = CapacityModel(config)
        self._metrics = metrics
        self._handles: dict[int, RequestHandle] = {}
        self._work = asyncio.Event()

    def gauges(self) -> GaugeReadings:
        return GaugeReadings(
            num_waiting=self._model.num_waiting,
            num_running=self._model.num_running,
            kv_cache_usage=self._model.kv_cache_usage,
        )

    def submit(self, prompt: Sequence[str], max_tokens: int, *, streaming: bool) -> RequestHandle:
        """Queue a request. Raises ``capacity.RequestTooLarge``."""
        now = asyncio.get_running_loop().time()
        request_id = self._model.submit(prompt, max_tokens, now)
        handle = RequestHandle(
            request_id=request_id,
            prompt_tokens=len(prompt),
            max_tokens=max_tokens,
            streaming=streaming,
        )
        self._handles[request_id] = handle
        self._work.set()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Give up on a request whose client went away; a no-op once it is done."""
        if handle.done:
            return
        self._model.abort(handle.request_id)
        self._handles.pop(handle.request_id, None)
        handle.aborted = True
        self._metrics.requests_aborted += 1
        handle.wake()

    def reset_prefix_cache(self) -> None:
        self._model.reset_prefix_cache()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        zero_steps = 0
        schedule = 0.0  # when the current run of back-to-back steps should end
        while True:
            idle = not self._model.has_work
            if idle:
                self._work.clear()
                await self._work.wait()
            started = loop.time()
            plan = self._model.begin_step(started)
            if plan is None:
                # Nothing fits although nothing runs: only a request larger than the
                # cache could do that, and submit refuses those. Wait for news.
                self._work.clear()
                await self._work.wait()
                continue
            for admission in plan.admitted:
                self._metrics.prompt_tokens += admission.prompt_tokens
                self._metrics.prefix_cache_queries += admission.prompt_tokens
                self._metrics.prefix_cache_hits += admission.cached_tokens
            if plan.duration_s > 0:
                # Back-to-back steps keep to a schedule rather than to the clock: what a
                # sleep oversleeps, or the server spends between steps, is taken from the
                # next step instead of adding up, so the pace is the model's.
                base = started if idle else max(schedule, started - MAX_LAG_S)
                schedule = base + plan.duration_s
                await asyncio.sleep(max(schedule - loop.time(), 0.0))
            else:
                # Steps that take no time run back to back, so a request in instant mode
                # is answered in one go; yielding now and then keeps the server serving.
                zero_steps += 1
                if zero_steps % ZERO_STEPS_PER_YIELD == 0:
                    await asyncio.sleep(0)
            self._deliver(self._model.end_step(loop.time()))

    def _deliver(self, result: StepResult) -> None:
        metrics = self._metrics
        handles = self._handles
        metrics.generation_tokens += len(result.tokens)
        for token in result.tokens:
            if token.index == 0:
                metrics.time_to_first_token.observe(token.latency_s)
            else:
                metrics.inter_token_latency.observe(token.latency_s)
            handle = handles.get(token.request_id)
            if handle is not None:
                handle.generated = token.index + 1
                if handle.streaming:
                    handle.wake()
        for finished in result.finished:
            metrics.requests_succeeded += 1
            metrics.e2e_request_latency.observe(finished.e2e_latency_s)
            handle = handles.pop(finished.request_id, None)
            if handle is not None:
                handle.finished = True
                handle.wake()
