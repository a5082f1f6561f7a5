"""The capacity model on a simulated clock: slots, KV blocks, prefix cache, step times."""

from __future__ import annotations

import pytest

from agent.simulator.capacity import (
    CapacityModel,
    RequestTooLarge,
    SequenceFinished,
    StepPlan,
    TokenEmitted,
)
from agent.simulator.config import CapacityConfig


def words(count: int, first: str = "w") -> tuple[str, ...]:
    return (first, *(f"t{index}" for index in range(1, count)))


class Clock:
    """Drives a model step by step, moving simulated time by each step's duration."""

    def __init__(self, model: CapacityModel) -> None:
        self.model = model
        self.now = 0.0
        self.plans: list[StepPlan] = []
        self.tokens: list[TokenEmitted] = []
        self.finished: dict[int, SequenceFinished] = {}

    def step(self) -> StepPlan:
        plan = self.model.begin_step(self.now)
        assert plan is not None, "nothing to run"
        self.plans.append(plan)
        self.now += plan.duration_s
        result = self.model.end_step(self.now)
        self.tokens.extend(result.tokens)
        self.finished.update((done.request_id, done) for done in result.finished)
        return plan

    def run_until_idle(self) -> None:
        while self.model.has_work:
            self.step()


def test_requests_beyond_max_num_seqs_wait_their_turn_in_arrival_order() -> None:
    model = CapacityModel(
        CapacityConfig(
            max_num_seqs=2, prefill_ms_per_token=0, decode_base_ms=10, decode_per_seq_ms=0
        )
    )
    first, second, third = (model.submit(words(4), 3, now=0.0) for _ in range(3))
    clock = Clock(model)

    plan = clock.step()

    assert [admission.request_id for admission in plan.admitted] == [first, second]
    assert (model.num_running, model.num_waiting) == (2, 1)

    clock.run_until_idle()

    assert clock.plans[3].admitted[0].request_id == third
    assert clock.finished[third].time_to_first_token_s == pytest.approx(0.040)
    assert clock.finished[first].time_to_first_token_s == pytest.approx(0.010)
    assert clock.finished[third].e2e_latency_s > clock.finished[first].e2e_latency_s


def test_a_request_is_admitted_only_when_its_kv_blocks_are_free() -> None:
    # Each request needs ceil((8 prompt + 4 output) / 4) = 3 of the 10 blocks.
    model = CapacityModel(CapacityConfig(max_num_seqs=8, block_size=4, num_blocks=10))
    for index in range(4):
        model.submit(words(8, first=f"p{index}"), 4, now=0.0)

    Clock(model).step()

    assert (model.num_running, model.num_waiting) == (3, 1)
    assert model.kv_cache_usage == pytest.approx(0.9)


def test_the_oldest_waiting_request_is_not_overtaken_by_a_smaller_one() -> None:
    model = CapacityModel(CapacityConfig(max_num_seqs=8, block_size=4, num_blocks=10))
    model.submit(words(20, first="big"), 4, now=0.0)  # 6 blocks
    model.submit(words(20, first="bigger"), 8, now=0.0)  # 7 blocks: waits for the first
    small = model.submit(words(2, first="small"), 2, now=0.0)  # 1 block would fit
    clock = Clock(model)

    clock.step()

    assert (model.num_running, model.num_waiting) == (1, 2)
    assert small not in clock.finished


def test_a_request_larger_than_the_whole_cache_is_refused() -> None:
    model = CapacityModel(CapacityConfig(block_size=4, num_blocks=2))

    with pytest.raises(RequestTooLarge, match="needs 3 KV blocks"):
        model.submit(words(8), 1, now=0.0)


def test_decode_steps_take_longer_as_the_batch_grows() -> None:
    config = CapacityConfig(
        max_num_seqs=8, prefill_ms_per_token=0, decode_base_ms=10, decode_per_seq_ms=5
    )
    alone = CapacityModel(config)
    alone.submit(words(4), 3, now=0.0)
    crowded = CapacityModel(config)
    for index in range(4):
        crowded.submit(words(4, first=f"c{index}"), 3, now=0.0)
    alone_clock, crowded_clock = Clock(alone), Clock(crowded)

    alone_clock.run_until_idle()
    crowded_clock.run_until_idle()

    def inter_token_latencies(clock: Clock) -> set[float]:
        return {round(token.latency_s, 9) for token in clock.tokens if token.index > 0}

    assert inter_token_latencies(alone_clock) == {0.015}
    assert inter_token_latencies(crowded_clock) == {0.030}


def test_a_step_that_admits_requests_also_prefills_their_prompts() -> None:
    model = CapacityModel(
        CapacityConfig(prefill_ms_per_token=0.5, decode_base_ms=10, decode_per_seq_ms=1)
    )
    model.submit(words(100), 2, now=0.0)
    clock = Clock(model)

    admitting, decoding = clock.step(), clock.step()

    assert admitting.duration_s == pytest.approx((100 * 0.5 + 11) / 1000)
    assert decoding.duration_s == pytest.approx(11 / 1000)


def test_an_identical_prompt_finds_its_full_blocks_in_the_prefix_cache() -> None:
    model = CapacityModel(CapacityConfig(block_size=16, prefill_ms_per_token=1))
    prompt = words(40)  # two full blocks and a partial one
    model.submit(prompt, 2, now=0.0)
    clock = Clock(model)
    clock.run_until_idle()

    model.submit(prompt, 2, now=clock.now)
    plan = clock.step()

    assert plan.admitted[0].cached_tokens == 32
    assert plan.duration_s == pytest.approx(clock.plans[0].duration_s - 0.032)


def test_a_prompt_that_differs_in_its_first_token_finds_nothing() -> None:
    model = CapacityModel(CapacityConfig(block_size=16))
    prompt = words(64)
    model.submit(prompt, 2, now=0.0)
    clock = Clock(model)
    clock.run_until_idle()

    model.submit(("W", *prompt[1:]), 2, now=clock.now)

    assert clock.step().admitted[0].cached_tokens == 0


def test_a_shared_prefix_hits_only_the_blocks_it_fills() -> None:
    model = CapacityModel(CapacityConfig(block_size=16))
    model.submit(words(64), 2, now=0.0)
    clock = Clock(model)
    clock.run_until_idle()

    model.submit((*words(40), "different", *words(23, first="x")), 2, now=clock.now)

    assert clock.step().admitted[0].cached_tokens == 32


def test_aborting_a_running_request_frees_its_slot_and_blocks() -> None:
    model = CapacityModel(CapacityConfig(max_num_seqs=1, block_size=4, num_blocks=100))
    running = model.submit(words(8, first="a"), 100, now=0.0)
    waiting = model.submit(words(8, first="b"), 4, now=0.0)
    clock = Clock(model)
    clock.step()

    assert model.abort(running)

    assert (model.num_running, model.kv_cache_usage) == (0, 0.0)
    clock.run_until_idle()
    assert set(clock.finished) == {waiting}
    assert not model.abort(running)


def test_aborting_a_waiting_request_takes_it_out_of_the_queue() -> None:
    model = CapacityModel(CapacityConfig(max_num_seqs=1))
    running = model.submit(words(4), 2, now=0.0)
    queued = model.submit(words(4, first="q"), 2, now=0.0)
    clock = Clock(model)
    clock.step()

    assert model.abort(queued)

    assert model.num_waiting == 0
    clock.run_until_idle()
    assert set(clock.finished) == {running}


def test_resetting_the_prefix_cache_forgets_every_prompt() -> None:
    model = CapacityModel(CapacityConfig(block_size=16))
    prompt = words(32)
    model.submit(prompt, 2, now=0.0)
    clock = Clock(model)
    clock.run_until_idle()

    model.reset_prefix_cache()
    model.submit(prompt, 2, now=clock.now)

    assert clock.step().admitted[0].cached_tokens == 0


def test_cached_blocks_nobody_holds_are_evicted_least_recently_used_first() -> None:
    # 5 blocks of 4 tokens. Each request takes 3 (8 prompt + 4 output tokens) and leaves
    # its 2 full prompt blocks cached, so the third request must evict the first's.
    model = CapacityModel(CapacityConfig(max_num_seqs=1, block_size=4, num_blocks=5))
    clock = Clock(model)
    for first in ("a", "b", "c"):
        model.submit(words(8, first=first), 4, now=clock.now)
        clock.run_until_idle()

    model.submit(words(8, first="b"), 4, now=clock.now)
    b_again = clock.step().admitted[0]
    clock.run_until_idle()
    model.submit(words(8, first="a"), 4, now=clock.now)
    a_again = clock.step().admitted[0]

    assert b_again.cached_tokens == 8
    assert a_again.cached_tokens == 0
