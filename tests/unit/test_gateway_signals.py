"""Reading engine signals from Prometheus text, whichever engine wrote it."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.simulator.metrics import (
    SIMULATED_PROFILES,
    EngineMetrics,
    GaugeReadings,
    SimulatedProfile,
    render,
)
from app.gateway.admission import Candidate, Signals, assess
from app.gateway.metrics import GatewayMetrics
from app.gateway.replica_book import ReplicaBook
from app.gateway.signals import (
    ADMITTED_BY,
    EngineReading,
    MetricsScraper,
    read_engine_signals,
    sum_samples,
)
from app.gateway.table import GatewaySnapshot, Route
from tests.support.waiting import wait_until

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="0"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="0"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",engine_type="unified",tp_rank="0"} 0.42
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 512
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.81
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 96
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 632.1
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 34.3
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

OLD_VLLM = """\
vllm:num_requests_running{model_name="llama"} 2
vllm:num_requests_waiting{model_name="llama"} 1
vllm:gpu_cache_usage_perc{model_name="llama"} 0.5
"""


def test_the_simulators_metrics_read_as_vllms() -> None:
    text = render(
        EngineMetrics(), GaugeReadings(num_waiting=4, num_running=9, kv_cache_usage=0.25), "m"
    )
    reading = read_engine_signals(text)
    assert reading is not None
    assert (reading.waiting, reading.running, reading.kv_usage) == (4, 9, 0.25)
    assert reading.names == (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    )


def test_sglang_names() -> None:
    reading = read_engine_signals(SGLANG)
    assert reading is not None
    assert (reading.waiting, reading.running, reading.kv_usage) == (3, 7, 0.42)
    assert reading.names == (
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
    )


def test_llamacpp_names_and_its_missing_kv_gauge() -> None:
    reading = read_engine_signals(LLAMACPP)
    assert reading is not None
    assert (reading.waiting, reading.running, reading.kv_usage) == (2, 4, 0)
    assert reading.names == ("llamacpp:requests_deferred", "llamacpp:requests_processing")
    assert reading.absent == ("kv_usage",)
    assert ADMITTED_BY[frozenset(reading.absent)] == "waiting queue only"


def test_an_older_llamacpp_build_still_gives_its_kv_gauge() -> None:
    reading = read_engine_signals(LLAMACPP + "llamacpp:kv_cache_usage_ratio 0.31\n")
    assert reading is not None
    assert reading.kv_usage == 0.31
    assert reading.absent == ()


@pytest.mark.parametrize("profile", ["vllm", "sglang", "llamacpp"])
def test_the_simulator_under_each_profile_reads_as_that_engine(profile: SimulatedProfile) -> None:
    gauges = GaugeReadings(num_waiting=4, num_running=9, kv_cache_usage=0.25)
    reading = read_engine_signals(render(EngineMetrics(), gauges, "m", profile))
    names = SIMULATED_PROFILES[profile].metrics
    assert reading is not None
    assert (reading.waiting, reading.running) == (4, 9)
    assert reading.names[:2] == (names.waiting[0], names.running[0])
    if profile == "llamacpp":
        assert (reading.kv_usage, reading.absent) == (0, ("kv_usage",))
    else:
        assert (reading.kv_usage, reading.absent) == (0.25, ())
        assert reading.names[2] == names.kv_usage[0]


def test_older_vllm_kv_name_is_the_fallback() -> None:
    reading = read_engine_signals(OLD_VLLM)
    assert reading is not None
    assert reading.kv_usage == 0.5
    assert "vllm:gpu_cache_usage_perc" in reading.names


def test_the_newer_kv_name_wins_when_both_are_there() -> None:
    reading = read_engine_signals(OLD_VLLM + 'vllm:kv_cache_usage_perc{model_name="llama"} 0.7\n')
    assert reading is not None
    assert reading.kv_usage == 0.7


def test_counts_are_summed_across_the_engine_label_and_kv_usage_is_the_fullest_engines() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.2\n'
    )
    reading = read_engine_signals(text)
    assert reading is not None
    assert reading.waiting == 5
    assert reading.kv_usage == 0.2
    assert reading.running == 0  # not exposed: nothing known to be running


def test_a_data_parallel_replica_half_full_is_not_refused_for_a_full_cache() -> None:
    # Two engines behind one server, each 45 % full: summed, their usage read 0.9, above
    # the default ceiling of 0.8, and the replica was refused at half its cache.
    page = (
        'vllm:num_requests_waiting{engine="0"} 0\n'
        'vllm:num_requests_waiting{engine="1"} 0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.45\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.45\n'
    )
    reading = read_engine_signals(page)
    assert reading is not None
    replica = Candidate(
        route=Route(replica_id="r", model="m", url="http://r"),
        signals=Signals(
            waiting=reading.waiting, running=0.0, kv_usage=reading.kv_usage, scraped_at=0.0
        ),
        in_flight=0,
        reserved=0,
    )
    assert assess(replica, now=0.0, stale_after_s=1.0) is not None


def test_odd_labels_timestamps_and_bad_lines_do_not_confuse_the_reader() -> None:
    text = (
        'vllm:num_requests_waiting{model_name="a} b\\" c",engine="0"} 4 1712345678000\n'
        "vllm:num_requests_waiting 1\n"
        'vllm:num_requests_waiting{model_name="unterminated 9\n'
        "vllm:num_requests_running{} not-a-number\n"
        "vllm:num_requests_running NaN\n"
        "vllm:kv_cache_usage_perc\n"
        "   \n"
        "vllm:kv_cache_usage_perc{} +Inf\n"
    )
    totals = sum_samples(text, frozenset({"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}))
    assert totals == {"vllm:num_requests_waiting": 5.0, "vllm:kv_cache_usage_perc": math.inf}


def test_a_negative_figure_is_skipped_not_believed() -> None:
    """An engine claiming less than nothing waiting would draw all of its model's traffic."""
    page = (
        'vllm:num_requests_waiting{engine="0"} -1e9\n'
        'vllm:num_requests_waiting{engine="1"} 3\n'
        "vllm:num_requests_running 2\n"
        "vllm:kv_cache_usage_perc -inf\n"
    )

    reading = read_engine_signals(page)

    assert reading is not None
    assert (reading.waiting, reading.running, reading.kv_usage) == (3.0, 2.0, 0.0)
    assert reading.absent == ("kv_usage",)


def test_an_engine_without_any_known_name_gives_no_reading() -> None:
    assert read_engine_signals("") is None
    assert read_engine_signals("process_cpu_seconds_total 12.5\n") is None
    assert read_engine_signals('vllm:num_requests_running{engine="0"} 3\n') is None


label_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=12
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@settings(max_examples=200)
@given(st.lists(st.tuples(label_values, st.integers(0, 1000)), min_size=1, max_size=8))
def test_any_label_values_sum_to_the_total(series: list[tuple[str, int]]) -> None:
    text = "".join(
        f'vllm:num_requests_waiting{{engine="{n}",model_name="{_escape(name)}"}} {value}\n'
        for n, (name, value) in enumerate(series)
    )
    reading = read_engine_signals(text)
    assert reading is not None
    assert reading.waiting == sum(value for _, value in series)


class _AnsweringScraper(MetricsScraper):
    """A scraper whose engine always answers: no socket, the reading is given."""

    async def scrape_once(self) -> EngineReading:
        return EngineReading(waiting=0.0, running=0.0, kv_usage=0.0, names=())


async def test_a_scraper_goes_on_when_the_router_fails_to_take_a_reading() -> None:
    # A bug where the reading is taken (the router serves its waiters there) must not end
    # the scraper as a bug in the scrape does not: its replica would stay stale for ever.
    reports: list[int] = []

    def report(sequence: int, reading: EngineReading | None) -> None:
        reports.append(sequence)
        if len(reports) == 1:
            raise OverflowError("cannot convert float infinity to integer")

    async with aiohttp.ClientSession() as session:
        scraper = _AnsweringScraper(
            replica_id="r-1",
            url="http://unused",
            session=session,
            interval_s=0.01,
            timeout_s=1.0,
            begin=lambda: len(reports) + 1,
            report=report,
        )
        task = asyncio.get_running_loop().create_task(scraper.run())
        try:
            await wait_until(lambda: len(reports) >= 2 or task.done(), what="a second report")
            assert not task.done(), task.exception()
        finally:
            task.cancel()
            await asyncio.wait([task])


def test_a_signal_the_engine_does_not_export_is_left_out_of_the_gateway_metrics() -> None:
    # llama.cpp has no KV-cache gauge: its replica is admitted as if the cache were empty,
    # but the gateway's /metrics must not say it is.
    book = ReplicaBook(
        scrape_interval_s=0.25, scrape_timeout_s=1.0, clock=lambda: 10.0, on_report=lambda _: None
    )
    route = Route(replica_id="llama-1", model="llama", url="http://127.0.0.1:1")
    book.take(GatewaySnapshot(declared=frozenset({"llama"}), routes={"llama": (route,)}))
    reading = read_engine_signals(LLAMACPP)
    assert reading is not None
    book.reported("llama-1", 1, reading)

    [view] = book.views()
    assert (view.waiting, view.running, view.kv_usage) == (reading.waiting, reading.running, None)
    metrics = GatewayMetrics()
    metrics.watch_replicas(book.views, dict)
    text = metrics.render().decode()
    assert 'llmgw_gateway_replica_waiting{model="llama",replica="llama-1"}' in text
    assert 'llmgw_gateway_replica_kv_usage{model="llama"' not in text
