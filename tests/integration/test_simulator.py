"""The real ``llmgw-sim-engine`` process, driven over HTTP by the OpenAI SDK and by hand."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import NamedTuple

import httpx
import msgspec
import openai
import pytest

from agent.simulator.config import CapacityConfig
from agent.simulator.launcher import SimulatorProcess, start_simulator
from agent.simulator.prediction import predict_steady_state
from tests.support.ports import free_port

MODEL = "sim-model"
FAST = ("--prefill-ms-per-token", "0", "--decode-base-ms", "1", "--decode-per-seq-ms", "0")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with start_simulator(*FAST, port=free_port()) as process:
        process.wait_healthy()
        yield process


@pytest.fixture(scope="module")
def one_slot_sim() -> Iterator[SimulatorProcess]:
    """One sequence at a time, 20 ms a token: long requests to walk away from."""
    with start_simulator(
        "--max-num-seqs",
        "1",
        "--decode-base-ms",
        "20",
        "--decode-per-seq-ms",
        "0",
        port=free_port(),
    ) as process:
        process.wait_healthy()
        yield process


# -- helpers -------------------------------------------------------------------------------


def metric_values(text: str) -> dict[str, float]:
    """Prometheus samples summed over their labels, by sample name."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values


def scrape(sim: SimulatorProcess) -> dict[str, float]:
    response = httpx.get(f"{sim.base_url}/metrics")
    response.raise_for_status()
    return metric_values(response.text)


async def scrape_async(sim: SimulatorProcess) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{sim.base_url}/metrics")
    response.raise_for_status()
    return metric_values(response.text)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not hold in time")
        await asyncio.sleep(0.02)


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not hold in time")
        time.sleep(0.02)


class EngineState(NamedTuple):
    waiting: float
    running: float
    kv_cache_usage: float
    aborted: float


async def engine_state(sim: SimulatorProcess) -> EngineState:
    values = await scrape_async(sim)
    return EngineState(
        waiting=values["vllm:num_requests_waiting"],
        running=values["vllm:num_requests_running"],
        kv_cache_usage=values["vllm:kv_cache_usage_perc"],
        aborted=values["llmgw_sim:requests_aborted_total"],
    )


async def until_engine_shows(sim: SimulatorProcess, **expected: float) -> None:
    async def shows() -> bool:
        state = (await engine_state(sim))._asdict()
        return all(state[name] == value for name, value in expected.items())

    await eventually(shows)


def chat_body(content: str, max_tokens: int, *, stream: bool = False) -> bytes:
    return msgspec.json.encode(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )


async def open_request(
    sim: SimulatorProcess, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def sync_client(sim: SimulatorProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.openai_base_url, api_key="unused", max_retries=0)


def async_client(sim: SimulatorProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.openai_base_url, api_key="unused", max_retries=0)


# -- the OpenAI API ------------------------------------------------------------------------


def test_the_sync_sdk_gets_chat_and_text_completions(sim: SimulatorProcess) -> None:
    client = sync_client(sim)

    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "three little words"}], max_tokens=5
    )
    text = client.completions.create(model=MODEL, prompt="one two", max_tokens=2)

    assert chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.content == "the quick brown fox jumps"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (3, 5)
    assert text.choices[0].text == "the quick"
    assert text.usage is not None
    assert text.usage.total_tokens == 4
    assert [model.id for model in client.models.list()] == [MODEL]


def test_without_max_tokens_the_answer_is_sixteen_tokens(sim: SimulatorProcess) -> None:
    chat = sync_client(sim).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )

    assert chat.usage is not None
    assert chat.usage.completion_tokens == 16


def test_the_raw_response_is_reachable(sim: SimulatorProcess) -> None:
    raw = sync_client(sim).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )

    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.parse().choices[0].message.content == "the"


async def test_the_async_sdk_streams_chat_with_a_usage_chunk(sim: SimulatorProcess) -> None:
    stream = await async_client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream this please"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )

    chunks = [chunk async for chunk in stream]

    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == "the quick brown fox"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 4)
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_the_async_sdk_streams_text_completions(sim: SimulatorProcess) -> None:
    client = async_client(sim)
    stream = await client.completions.create(
        model=MODEL,
        prompt="a b c",
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )

    chunks = [chunk async for chunk in stream]
    whole = await client.completions.create(model=MODEL, prompt="a b c", max_tokens=3)

    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == "the quick brown"
    assert whole.choices[0].text == "the quick brown"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


def test_the_raw_stream_ends_with_done(sim: SimulatorProcess) -> None:
    with httpx.stream(
        "POST",
        f"{sim.openai_base_url}/chat/completions",
        content=chat_body("hi", 2, stream=True),
    ) as response:
        events = [line for line in response.iter_lines() if line]

    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: {") for event in events[:-1])


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"model": "sim-model", "messages": [', 400),
        (b'{"model": "sim-model"}', 400),
        (b'{"model": "other-model", "messages": []}', 404),
    ],
)
def test_bad_requests_get_openai_error_bodies(
    sim: SimulatorProcess, body: bytes, status: int
) -> None:
    response = httpx.post(f"{sim.openai_base_url}/chat/completions", content=body)

    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


def test_the_sdk_sees_an_unknown_model_as_not_found(sim: SimulatorProcess) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        sync_client(sim).completions.create(model="gpt-unknown", prompt="hi")

    assert raised.value.code == "model_not_found"


def test_flat_error_style_answers_with_a_detail() -> None:
    with start_simulator("--error-style", "flat", *FAST, port=free_port()) as sim:
        sim.wait_healthy()

        response = httpx.post(
            f"{sim.openai_base_url}/completions", json={"model": "x", "prompt": "hi"}
        )

    assert response.status_code == 404
    assert response.json() == {"detail": "The model `x` does not exist."}


def test_a_prompt_over_the_context_is_refused_as_vllm_refuses_it() -> None:
    """The context is what the whole cache holds (4 blocks of 16 tokens: 64); over it, the
    answer is vLLM's (0.10 and later, ``serving_engine.py``), whose wording applications
    and the gateway recognise. Before, it was the simulator's own sentence about KV
    blocks."""
    with start_simulator("--num-blocks", "4", "--block-size", "16", *FAST, port=free_port()) as sim:
        sim.wait_healthy()
        client = sync_client(sim)

        with pytest.raises(openai.BadRequestError) as prompt_alone:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "w " * 70}], max_tokens=1
            )
        with pytest.raises(openai.BadRequestError) as with_output:
            client.completions.create(model=MODEL, prompt="w " * 50, max_tokens=20)

    # The SDK's message is "Error code: 400 - " and the body's.
    assert prompt_alone.value.message.removeprefix("Error code: 400 - ") == (
        "This model's maximum context length is 64 tokens. However, your request has 70 "
        "input tokens."
    )
    assert with_output.value.message.removeprefix("Error code: 400 - ") == (
        "This model's maximum context length is 64 tokens. However, you requested 20 output "
        "tokens and your prompt contains 50 input tokens, for a total of 70 tokens. Please "
        "reduce the length of the input prompt or the number of requested output tokens."
    )
    assert with_output.value.param == "input_tokens"


# -- metrics and the capacity model --------------------------------------------------------


def test_metrics_use_vllm_names(sim: SimulatorProcess) -> None:
    sync_client(sim).completions.create(model=MODEL, prompt="count me", max_tokens=3)

    values = scrape(sim)

    for gauge in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ):
        assert gauge in values
    assert 0.0 <= values["vllm:kv_cache_usage_perc"] <= 1.0
    for counter in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "llmgw_sim:requests_aborted_total",
    ):
        assert counter in values
    assert values["vllm:request_success_total"] >= 1
    assert values["vllm:generation_tokens_total"] >= 3
    for histogram in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert values[f"{histogram}_count"] >= 1
        assert f"{histogram}_bucket" in values


async def test_requests_beyond_the_batch_wait_and_take_longer() -> None:
    with start_simulator(
        "--max-num-seqs",
        "2",
        "--decode-base-ms",
        "20",
        "--decode-per-seq-ms",
        "0",
        port=free_port(),
    ) as sim:
        sim.wait_healthy()
        client = async_client(sim)

        async def timed_request(number: int) -> float:
            started = time.monotonic()
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"load {number}"}], max_tokens=10
            )
            return time.monotonic() - started

        alone = await timed_request(0)
        load = asyncio.gather(*(timed_request(number) for number in range(1, 7)))
        most_waiting = 0.0
        while not load.done():
            most_waiting = max(most_waiting, (await scrape_async(sim))["vllm:num_requests_waiting"])
        under_load = await load
        values = await scrape_async(sim)

    assert most_waiting > 0
    assert max(under_load) > 2 * alone
    mean_inter_token_latency = (
        values["vllm:inter_token_latency_seconds_sum"]
        / values["vllm:inter_token_latency_seconds_count"]
    )
    predicted = predict_steady_state(
        CapacityConfig(max_num_seqs=2, decode_base_ms=20, decode_per_seq_ms=0),
        concurrency=6,
        prompt_tokens=2,
        output_tokens=10,
    )
    assert mean_inter_token_latency == pytest.approx(predicted.time_per_output_token_s, rel=0.1)


async def test_identical_prompts_hit_the_prefix_cache_until_it_is_reset(
    sim: SimulatorProcess,
) -> None:
    client = async_client(sim)
    prompt = " ".join([uuid.uuid4().hex, *(f"word{index}" for index in range(63))])  # 4 blocks

    async def prefix_hits_of_one_request() -> float:
        before = (await scrape_async(sim))["vllm:prefix_cache_hits_total"]
        await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
        return (await scrape_async(sim))["vllm:prefix_cache_hits_total"] - before

    first, second = await prefix_hits_of_one_request(), await prefix_hits_of_one_request()
    async with httpx.AsyncClient() as http:
        reset = await http.post(f"{sim.base_url}/reset_prefix_cache")
    after_reset = await prefix_hits_of_one_request()

    assert reset.status_code == 200
    assert (first, second, after_reset) == (0, 64, 0)


# -- clients that go away ------------------------------------------------------------------


async def test_a_client_leaving_mid_stream_aborts_its_request(
    one_slot_sim: SimulatorProcess,
) -> None:
    aborted_before = (await engine_state(one_slot_sim)).aborted
    reader, writer = await open_request(one_slot_sim, chat_body("long", 500, stream=True))
    await reader.readuntil(b'"content":"the"')

    await hang_up(writer)

    await until_engine_shows(one_slot_sim, aborted=aborted_before + 1, running=0, kv_cache_usage=0)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_leaving_before_its_first_token_aborts_its_request(
    one_slot_sim: SimulatorProcess, stream: bool
) -> None:
    aborted_before = (await engine_state(one_slot_sim)).aborted
    _, occupying = await open_request(one_slot_sim, chat_body("occupy", 500))
    _, queued = await open_request(one_slot_sim, chat_body("queued", 5, stream=stream))
    await until_engine_shows(one_slot_sim, running=1, waiting=1)

    await hang_up(queued)

    await until_engine_shows(one_slot_sim, waiting=0, aborted=aborted_before + 1)
    await hang_up(occupying)
    await until_engine_shows(one_slot_sim, running=0, aborted=aborted_before + 2)


# -- configuration and faults --------------------------------------------------------------


def test_settings_come_from_the_environment_and_are_printed_at_start() -> None:
    env = {"LLMGW_SIM_MODEL": "env-model", "LLMGW_SIM_MAX_NUM_SEQS": "3"}
    with start_simulator(env={**env, "CUDA_VISIBLE_DEVICES": "2,3"}, port=free_port()) as sim:
        sim.wait_healthy()

        models = [model.id for model in sync_client(sim).models.list()]
        startup = sim.stderr_text()

    assert models == ["env-model"]
    assert "max_num_seqs=3" in startup
    assert "cuda_visible_devices='2,3'" in startup


def test_start_delay_answers_503_until_ready() -> None:
    with start_simulator("--start-delay", "1", port=free_port()) as sim:
        statuses: list[int | None] = []

        def healthy() -> bool:
            statuses.append(sim.health_status())
            return statuses[-1] == 200

        wait_for(healthy)

    answered = [status for status in statuses if status is not None]
    assert answered[0] == 503
    assert answered[-1] == 200


def test_exit_after_fails_with_a_message() -> None:
    with start_simulator("--exit-after", "0.5", port=free_port()) as sim:
        code = sim.wait_exit()

        assert code != 0
        assert "--exit-after" in sim.stderr_text()


def test_crash_after_requests_serves_that_many_then_fails() -> None:
    with start_simulator("--crash-after-requests", "2", *FAST, port=free_port()) as sim:
        sim.wait_healthy()
        client = sync_client(sim)

        answers = [
            client.completions.create(model=MODEL, prompt="hi", max_tokens=1) for _ in range(2)
        ]
        code = sim.wait_exit()

        assert [answer.choices[0].text for answer in answers] == ["the", "the"]
        assert code != 0
        assert "--crash-after-requests" in sim.stderr_text()
        with pytest.raises(openai.APIConnectionError):
            client.completions.create(model=MODEL, prompt="hi", max_tokens=1)


def test_a_port_in_use_is_one_line_and_exit_code_1_as_for_every_program() -> None:
    """uvicorn bound the port itself and ended with its own code 3 (the code the simulator's
    faults play a crash with) and a log line of its own."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with start_simulator(port=port) as sim:
            code = sim.wait_exit()
            stderr = sim.stderr_text()

    assert code == 1
    assert (
        stderr
        == f"llmgw-sim-engine: port {port} on 127.0.0.1 is in use; choose another with --port\n"
    )


def test_a_host_it_cannot_listen_on_is_one_line_and_exit_code_1() -> None:
    with start_simulator("--host", "no-such-host.invalid", port=free_port()) as sim:
        code = sim.wait_exit()
        stderr = sim.stderr_text()

    assert code == 1
    assert stderr.startswith("llmgw-sim-engine: cannot listen on no-such-host.invalid: "), stderr
    assert stderr.endswith("; choose another --host\n"), stderr


def test_the_served_model_name_is_served_and_the_model_flag_is_not_whatever_their_order() -> None:
    """As vLLM serves it: clients use --served-model-name; --model names the weights."""
    weights = "meta-llama/Llama-3.1-8B-Instruct"
    with start_simulator(
        "--served-model-name", "llama", "--model", weights, *FAST, port=free_port()
    ) as sim:
        sim.wait_healthy()
        client = sync_client(sim)

        models = [model.id for model in client.models.list()]
        answer = client.completions.create(model="llama", prompt="hi", max_tokens=1)
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=weights, prompt="hi", max_tokens=1)

    assert models == ["llama"]
    assert answer.model == "llama"
