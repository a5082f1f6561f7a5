"""The capacity model: a continuous-batching scheduler stepped by whoever owns the clock.

Nothing here sleeps, awaits or reads the time; every call takes ``now`` in seconds.
A step has two halves, so the time between them can be real (the asyncio engine
sleeps) or simulated (tests and the prediction check just move ``now`` forward)::

    plan = model.begin_step(now)          # admit waiting requests, say how long it takes
    ... plan.duration_s passes ...
    result = model.end_step(now)          # one token for every running sequence

Admission is first come, first served: the oldest waiting request is admitted when a
slot (``max_num_seqs``) is free and the KV cache can give it
``ceil((prompt + max_tokens) / block_size)`` blocks, less the blocks of its prompt that
the prefix cache already holds; nobody overtakes it while it waits. A step lasts the
prefill of the uncached prompt tokens of the requests it admitted plus one decode step,
``decode_base_ms + decode_per_seq_ms * running``, at the end of which every running
sequence has one more token. A sequence that reaches ``max_tokens`` finishes and frees its
slot and blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import msgspec

from agent.simulator.config import CapacityConfig
from agent.simulator.kv_cache import BlockAllocation, KvCache, prompt_block_hashes


class RequestTooLarge(ValueError):
    """The request needs more KV blocks than the whole cache has; it could never run: its
    prompt and output are over the context, which is what the whole cache holds."""

    def __init__(self, message: str, *, prompt_tokens: int, max_tokens: int, context: int):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context = context


class Admission(msgspec.Struct, frozen=True):
    request_id: int
    prompt_tokens: int
    cached_tokens: int


class StepPlan(msgspec.Struct, frozen=True):
    duration_s: float
    admitted: tuple[Admission, ...]
    batch_size: int


class TokenEmitted(msgspec.Struct, frozen=True):
    """Output token ``index`` of a request; ``latency_s`` is the time since the request
    arrived for the first token and since the previous token for the others."""

    request_id: int
    index: int
    latency_s: float


class SequenceFinished(msgspec.Struct, frozen=True):
    request_id: int
    prompt_tokens: int
    output_tokens: int
    time_to_first_token_s: float
    e2e_latency_s: float


class StepResult(msgspec.Struct, frozen=True):
    tokens: tuple[TokenEmitted, ...]
    finished: tuple[SequenceFinished, ...]


class _Sequence:
    __slots__ = (
        "allocation",
        "arrived_at",
        "block_hashes",
        "blocks_needed",
        "first_token_at",
        "generated",
        "last_token_at",
        "max_tokens",
        "prompt_tokens",
        "request_id",
    )

    def __init__(
        self,
        *,
        request_id: int,
        prompt_tokens: int,
        block_hashes: tuple[int, ...],
        blocks_needed: int,
        max_tokens: int,
        arrived_at: float,
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.block_hashes = block_hashes
        self.blocks_needed = blocks_needed
        self.max_tokens = max_tokens
        self.arrived_at = arrived_at
        self.allocation: BlockAllocation | None = None
        self.generated = 0
        self.first_token_at = 0.0
        self.last_token_at = 0.0


class CapacityModel:
    def __init__(self, config: CapacityConfig) -> None:
        self._config = config
        self._kv = KvCache(config.num_blocks)
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[int, _Sequence] = {}
        self._next_id = 1
        self._step: StepPlan | None = None

    @property
    def config(self) -> CapacityConfig:
        return self._config

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def kv_cache_usage(self) -> float:
        return self._kv.usage

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def submit(self, prompt: Sequence[str], max_tokens: int, now: float) -> int:
        """Queue a request; returns its id. Raises ``RequestTooLarge``."""
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        blocks_needed = self._config.blocks_for(len(prompt) + max_tokens)
        if blocks_needed > self._config.num_blocks:
            raise RequestTooLarge(
                f"the request needs {blocks_needed} KV blocks of {self._config.block_size} "
                f"tokens ({len(prompt)} prompt + {max_tokens} output tokens) but the cache "
                f"has {self._config.num_blocks}",
                prompt_tokens=len(prompt),
                max_tokens=max_tokens,
                context=self._config.num_blocks * self._config.block_size,
            )
        request_id = self._next_id
        self._next_id += 1
        self._waiting.append(
            _Sequence(
                request_id=request_id,
                prompt_tokens=len(prompt),
                block_hashes=prompt_block_hashes(prompt, self._config.block_size),
                blocks_needed=blocks_needed,
                max_tokens=max_tokens,
                arrived_at=now,
            )
        )
        return request_id

    def abort(self, request_id: int) -> bool:
        """Drop a waiting or running request and free what it holds; ``False`` when it is
        not here (already finished or aborted)."""
        sequence = self._running.pop(request_id, None)
        if sequence is not None:
            self._release(sequence)
            return True
        for waiting in self._waiting:
            if waiting.request_id == request_id:
                self._waiting.remove(waiting)
                return True
        return False

    def reset_prefix_cache(self) -> None:
        self._kv.reset()

    def begin_step(self, now: float) -> StepPlan | None:
        """Admit what fits and plan one step; ``None`` when nothing is running."""
        if self._step is not None:
            raise RuntimeError("end the current step before beginning another")
        admitted = self._admit()
        if not self._running:
            return None
        uncached = sum(admission.prompt_tokens - admission.cached_tokens for admission in admitted)
        batch_size = len(self._running)
        duration_ms = uncached * self._config.prefill_ms_per_token + self._config.decode_step_ms(
            batch_size
        )
        self._step = StepPlan(
            duration_s=duration_ms / 1000.0, admitted=tuple(admitted), batch_size=batch_size
        )
        return self._step

    def end_step(self, now: float) -> StepResult:
        if self._step is None:
            raise RuntimeError("no step in progress")
        self._step = None
        tokens: list[TokenEmitted] = []
        finished: list[SequenceFinished] = []
        for sequence in list(self._running.values()):
            if sequence.generated == 0:
                sequence.first_token_at = now
                latency = now - sequence.arrived_at
            else:
                latency = now - sequence.last_token_at
            tokens.append(TokenEmitted(sequence.request_id, sequence.generated, latency))
            sequence.generated += 1
            sequence.last_token_at = now
            if sequence.generated >= sequence.max_tokens:
                del self._running[sequence.request_id]
                self._release(sequence)
                finished.append(
                    SequenceFinished(
                        request_id=sequence.request_id,
                        prompt_tokens=sequence.prompt_tokens,
                        output_tokens=sequence.generated,
                        time_to_first_token_s=sequence.first_token_at - sequence.arrived_at,
                        e2e_latency_s=now - sequence.arrived_at,
                    )
                )
        return StepResult(tokens=tuple(tokens), finished=tuple(finished))

    def _admit(self) -> list[Admission]:
        admitted: list[Admission] = []
        block_size = self._config.block_size
        while self._waiting and len(self._running) < self._config.max_num_seqs:
            head = self._waiting[0]
            allocation = self._kv.try_allocate(head.block_hashes, head.blocks_needed)
            if allocation is None:
                break
            self._waiting.popleft()
            head.allocation = allocation
            self._running[head.request_id] = head
            admitted.append(
                Admission(head.request_id, head.prompt_tokens, allocation.hit_blocks * block_size)
            )
        return admitted

    def _release(self, sequence: _Sequence) -> None:
        if sequence.allocation is not None:
            self._kv.release(sequence.allocation)
            sequence.allocation = None
