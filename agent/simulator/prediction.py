"""What the capacity model predicts for a steady closed-loop load.

``c`` clients each send a request, wait for the whole answer and send the next at once.
Every request has ``P`` prompt tokens of which ``H`` are already in the prefix cache, and
asks for ``O`` output tokens. With the configuration's times in milliseconds:

    blocks   = ceil((P + O) / block_size)
    b        = min(c, max_num_seqs, floor(num_blocks / blocks))     running batch
    t_decode = decode_base_ms + decode_per_seq_ms * b               one decode step
    t_first  = t_decode + b * (P - H) * prefill_ms_per_token        the admitting step
    service  = t_first + (O - 1) * t_decode                         admission to last token
    X        = b / service                                          requests per ms
    e2e      = c / X                                                Little's law
    TTFT     = e2e - service + t_first                              queueing + first step
    TPOT     = t_decode                                             between output tokens
    tokens/s = 1000 * X * O
    waiting  = c - b,   kv usage = b * blocks / num_blocks

Requests that are admitted together have the same length, so they finish together and
the next ``b`` waiting ones are admitted in one step: the batch moves in cohorts, which is
why a cohort's whole prefill lands in its first step. The formulas are exact for the
model itself when ``c`` is a multiple of ``b``; a real client adds its own round trip
between requests, which the prediction leaves out.
"""

from __future__ import annotations

import msgspec

from agent.simulator.config import CapacityConfig


class SteadyStatePrediction(msgspec.Struct, frozen=True, kw_only=True):
    concurrency: int
    batch_size: int
    time_to_first_token_s: float
    time_per_output_token_s: float
    e2e_latency_s: float
    requests_per_s: float
    output_tokens_per_s: float
    num_requests_waiting: int
    kv_cache_usage: float


def predict_steady_state(
    config: CapacityConfig,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    cached_prompt_tokens: int = 0,
) -> SteadyStatePrediction:
    if concurrency < 1 or output_tokens < 1:
        raise ValueError("concurrency and output_tokens must be at least 1")
    if not 0 <= cached_prompt_tokens <= prompt_tokens:
        raise ValueError("cached_prompt_tokens must lie between 0 and prompt_tokens")
    blocks = config.blocks_for(prompt_tokens + output_tokens)
    if blocks > config.num_blocks:
        raise ValueError("one request needs more KV blocks than the cache has")
    batch = min(concurrency, config.max_num_seqs, config.num_blocks // blocks)
    decode_ms = config.decode_step_ms(batch)
    first_step_ms = (
        decode_ms + batch * (prompt_tokens - cached_prompt_tokens) * config.prefill_ms_per_token
    )
    service_ms = first_step_ms + (output_tokens - 1) * decode_ms
    if service_ms == 0:
        return _instant(concurrency, batch, blocks, config)
    requests_per_ms = batch / service_ms
    e2e_ms = concurrency / requests_per_ms
    return SteadyStatePrediction(
        concurrency=concurrency,
        batch_size=batch,
        time_to_first_token_s=(e2e_ms - service_ms + first_step_ms) / 1000.0,
        time_per_output_token_s=decode_ms / 1000.0,
        e2e_latency_s=e2e_ms / 1000.0,
        requests_per_s=requests_per_ms * 1000.0,
        output_tokens_per_s=requests_per_ms * 1000.0 * output_tokens,
        num_requests_waiting=concurrency - batch,
        kv_cache_usage=batch * blocks / config.num_blocks,
    )


def _instant(
    concurrency: int, batch: int, blocks: int, config: CapacityConfig
) -> SteadyStatePrediction:
    return SteadyStatePrediction(
        concurrency=concurrency,
        batch_size=batch,
        time_to_first_token_s=0.0,
        time_per_output_token_s=0.0,
        e2e_latency_s=0.0,
        requests_per_s=float("inf"),
        output_tokens_per_s=float("inf"),
        num_requests_waiting=concurrency - batch,
        kv_cache_usage=batch * blocks / config.num_blocks,
    )
