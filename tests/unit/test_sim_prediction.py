"""The steady-state prediction, by hand and against the capacity model itself."""

from __future__ import annotations

import statistics

import msgspec
import pytest

from agent.simulator.capacity import CapacityModel, SequenceFinished
from agent.simulator.config import CapacityConfig
from agent.simulator.prediction import predict_steady_state

CONFIG = CapacityConfig(
    max_num_seqs=4,
    block_size=16,
    num_blocks=1000,
    prefill_ms_per_token=0.2,
    decode_base_ms=10,
    decode_per_seq_ms=2,
)


def test_below_the_slot_limit_every_client_runs_at_once() -> None:
    predicted = predict_steady_state(CONFIG, concurrency=2, prompt_tokens=100, output_tokens=11)

    # decode step 10 + 2*2 = 14 ms; first step adds 2 * 100 * 0.2 = 40 ms of prefill.
    assert predicted.batch_size == 2
    assert predicted.time_per_output_token_s == pytest.approx(0.014)
    assert predicted.time_to_first_token_s == pytest.approx(0.054)
    assert predicted.e2e_latency_s == pytest.approx(0.054 + 10 * 0.014)
    assert predicted.requests_per_s == pytest.approx(2 / 0.194)
    assert predicted.output_tokens_per_s == pytest.approx(11 * 2 / 0.194)
    assert predicted.num_requests_waiting == 0


def test_beyond_the_slot_limit_clients_queue_and_throughput_stops_growing() -> None:
    at_limit = predict_steady_state(CONFIG, concurrency=4, prompt_tokens=100, output_tokens=11)
    beyond = predict_steady_state(CONFIG, concurrency=8, prompt_tokens=100, output_tokens=11)

    assert beyond.batch_size == 4
    assert beyond.num_requests_waiting == 4
    assert beyond.requests_per_s == pytest.approx(at_limit.requests_per_s)
    assert beyond.e2e_latency_s == pytest.approx(2 * at_limit.e2e_latency_s)
    assert beyond.time_to_first_token_s > at_limit.time_to_first_token_s


def test_the_kv_cache_can_limit_the_batch_before_the_slots_do() -> None:
    small_cache = msgspec.structs.replace(CONFIG, num_blocks=20)

    predicted = predict_steady_state(
        small_cache, concurrency=4, prompt_tokens=150, output_tokens=10
    )  # 10 blocks a request

    assert predicted.batch_size == 2
    assert predicted.kv_cache_usage == pytest.approx(1.0)


def test_cached_prompt_tokens_shorten_the_first_token_only() -> None:
    cold = predict_steady_state(CONFIG, concurrency=2, prompt_tokens=100, output_tokens=11)
    warm = predict_steady_state(
        CONFIG, concurrency=2, prompt_tokens=100, output_tokens=11, cached_prompt_tokens=96
    )

    assert warm.time_to_first_token_s == pytest.approx(cold.time_to_first_token_s - 0.0384)
    assert warm.time_per_output_token_s == cold.time_per_output_token_s


class Measured(msgspec.Struct, frozen=True):
    time_to_first_token_s: float
    time_per_output_token_s: float
    e2e_latency_s: float
    requests_per_s: float


def simulate_closed_loop(
    config: CapacityConfig, *, concurrency: int, prompt_tokens: int, output_tokens: int
) -> Measured:
    """``concurrency`` clients each resubmit as soon as they are answered, with prompts
    that share nothing; the second half of the completions is the steady state."""

    def unique_prompt(number: int) -> tuple[str, ...]:
        return (f"request{number}", *(f"t{index}" for index in range(1, prompt_tokens)))

    model = CapacityModel(config)
    now = 0.0
    completions: list[tuple[float, SequenceFinished]] = []
    for client in range(concurrency):
        model.submit(unique_prompt(client), output_tokens, now)
    while len(completions) < 20 * concurrency:
        plan = model.begin_step(now)
        assert plan is not None
        now += plan.duration_s
        for done in model.end_step(now).finished:
            completions.append((now, done))
            model.submit(unique_prompt(concurrency + len(completions)), output_tokens, now)
    steady = completions[len(completions) // 2 :]
    ttft = statistics.fmean(done.time_to_first_token_s for _, done in steady)
    e2e = statistics.fmean(done.e2e_latency_s for _, done in steady)
    first_at, last_at = steady[0][0], steady[-1][0]
    completed_after_first = sum(1 for at, _ in steady if at > first_at)
    return Measured(
        time_to_first_token_s=ttft,
        time_per_output_token_s=(e2e - ttft) / (output_tokens - 1),
        e2e_latency_s=e2e,
        requests_per_s=completed_after_first / (last_at - first_at),
    )


@pytest.mark.parametrize("concurrency", [1, 2, 4, 8, 12])
def test_the_prediction_matches_the_model_under_a_steady_closed_loop(concurrency: int) -> None:
    predicted = predict_steady_state(
        CONFIG, concurrency=concurrency, prompt_tokens=64, output_tokens=8
    )

    measured = simulate_closed_loop(
        CONFIG, concurrency=concurrency, prompt_tokens=64, output_tokens=8
    )

    assert measured.time_to_first_token_s == pytest.approx(predicted.time_to_first_token_s)
    assert measured.time_per_output_token_s == pytest.approx(predicted.time_per_output_token_s)
    assert measured.e2e_latency_s == pytest.approx(predicted.e2e_latency_s)
    assert measured.requests_per_s == pytest.approx(predicted.requests_per_s)


def test_an_instant_configuration_predicts_no_latency() -> None:
    predicted = predict_steady_state(
        CONFIG.instant(), concurrency=3, prompt_tokens=10, output_tokens=5
    )

    assert predicted.e2e_latency_s == 0.0
    assert predicted.requests_per_s == float("inf")
