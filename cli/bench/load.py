"""One level's load: ``concurrency`` clients, each sending its next streamed request
(``request.stream_request``) as soon as its last one ended, through three phases:

    warm-up    nothing is measured while the engine's batch and caches fill
    measure    requests started now are measured; tokens and finished requests count
               towards throughput; the window lasts the duration, or until the request
               count has started, and at least until as many measured requests as there are
               clients have started
    finish     clients keep the load on, unmeasured, until every measured request ended;
               then every request still running is cancelled (the engine aborts it)

A level whose every request fails (``TotalFailure``: each client saw one fail, twenty in
all, none succeeded) stops there, in whichever phase, and counts every request it sent:
an engine that refuses each request at once is not sent thousands more to learn it.
"""

from __future__ import annotations

import asyncio
import time
from enum import Enum

import aiohttp

from cli.bench.errors import TargetUnreachable
from cli.bench.prompts import PromptSource
from cli.bench.request import RequestFailed, stream_request
from cli.bench.stats import LevelLoad, RequestOutcome
from cli.bench.target import Engine
from cli.bench.total_failure import TotalFailure


class Phase(Enum):
    WARM_UP = "warm-up"
    MEASURE = "measuring"
    FINISH = "finishing"


class ClosedLoop:
    """One level's load. Read ``phase`` and the counters while it runs for progress."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine: Engine,
        prompts: PromptSource,
        *,
        concurrency: int,
        output_tokens: int,
        warmup_s: float,
        duration_s: float,
        max_requests: int | None,
        request_timeout_s: float,
    ) -> None:
        self._session = session
        self._engine = engine
        self._prompts = prompts
        self.concurrency = concurrency
        self._output_tokens = output_tokens
        self._warmup_s = warmup_s
        self.duration_s = duration_s
        self.max_requests = max_requests
        self._min_requests = min(concurrency, max_requests or concurrency)
        self._request_timeout_s = request_timeout_s
        self.phase = Phase.WARM_UP
        self.measured = 0
        """Requests started in the window."""
        self._outstanding = 0
        self.outcomes: list[RequestOutcome] = []
        self.errors: list[str] = []
        self._total_failure = TotalFailure(concurrency)
        self._failures_before_a_success: list[str] = []
        """Every failure of the level, warm-up included, until a request succeeds: what a
        level that stops for failing whole reports."""
        self.ended_early = False
        self._finished_in_window = 0
        self._tokens_in_window = 0
        self._window_start = 0.0
        self._window_end = 0.0
        self._deadline = 0.0
        self._done = asyncio.Event()
        """Set once every measured request ended, or the engine became unreachable."""
        self._failure: TargetUnreachable | None = None

    @property
    def window_elapsed_s(self) -> float:
        if self.phase is Phase.WARM_UP:
            return 0.0
        end = self._window_end if self.phase is Phase.FINISH else time.perf_counter()
        return end - self._window_start

    async def run(self) -> LevelLoad:
        """Raises ``TargetUnreachable`` when the engine stops taking connections."""
        clients = [asyncio.create_task(self._client(index)) for index in range(self.concurrency)]
        try:
            await self._until_done(clients, self._warmup_s)
            if not self._done.is_set():
                self._open_window()
                await self._until_done(clients, None)
        finally:
            for client in clients:
                client.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
        if self._failure is not None:
            raise self._failure
        return LevelLoad(
            concurrency=self.concurrency,
            window_s=self._window_end - self._window_start,
            outcomes=self.outcomes,
            errors=self._failures_before_a_success if self.ended_early else self.errors,
            finished_in_window=self._finished_in_window,
            output_tokens_in_window=self._tokens_in_window,
            ended_early=self.ended_early,
        )

    async def _until_done(self, clients: list[asyncio.Task[None]], within_s: float | None) -> None:
        """Wait until the level is done or ``within_s`` passes. A client only ends early by
        a fault of its own; its exception is raised here rather than hang the level."""
        waiter = asyncio.create_task(self._done.wait())
        try:
            ended, _ = await asyncio.wait(
                [waiter, *clients], timeout=within_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        for task in ended:
            if task is not waiter:
                task.result()

    def _open_window(self) -> None:
        self.phase = Phase.MEASURE
        self._window_start = time.perf_counter()
        self._deadline = self._window_start + self.duration_s
        if self.max_requests is None:
            asyncio.get_running_loop().call_later(self.duration_s, self._close_window_when_due)

    def _close_window_when_due(self) -> None:
        if self.phase is not Phase.MEASURE or self.measured < self._min_requests:
            return
        if self.max_requests is not None:
            due = self.measured >= self.max_requests
        else:
            due = time.perf_counter() >= self._deadline
        if due:
            self.phase = Phase.FINISH
            self._window_end = time.perf_counter()
            if self._outstanding == 0:
                self._done.set()

    def _count_failure(self, client: int, message: str) -> None:
        self._total_failure.failed(client)
        if self.ended_early or not self._total_failure.nothing_succeeded:
            return
        self._failures_before_a_success.append(message)
        if self._total_failure.certain:
            self.ended_early = True
            if self.phase is Phase.MEASURE:
                self.phase = Phase.FINISH
                self._window_end = time.perf_counter()
            self._done.set()

    def _count_tokens(self, count: int) -> None:
        if self.phase is Phase.MEASURE:
            self._tokens_in_window += count

    async def _client(self, index: int) -> None:
        while True:
            measured = self.phase is Phase.MEASURE
            if measured:
                self.measured += 1
                self._outstanding += 1
                self._close_window_when_due()
            try:
                outcome = await stream_request(
                    self._session,
                    self._engine,
                    self._prompts.next_prompt(),
                    self._output_tokens,
                    timeout_s=self._request_timeout_s,
                    on_tokens=self._count_tokens,
                )
            except RequestFailed as exc:
                if measured:
                    self.errors.append(str(exc))
                self._count_failure(index, str(exc))
            except TargetUnreachable as exc:
                self._failure = exc
                self._done.set()
                return
            else:
                self._total_failure.succeeded()
                if self.phase is Phase.MEASURE:
                    self._finished_in_window += 1
                if measured:
                    self.outcomes.append(outcome)
            if measured:
                self._outstanding -= 1
                if self._outstanding == 0 and self.phase is Phase.FINISH:
                    self._done.set()
