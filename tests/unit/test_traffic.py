"""What gateways measure of replicas' requests: histograms that merge exactly, percentiles
within the stated resolution, a window that forgets, outcomes classified, hostile reports
refused."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.traffic import (
    BUCKET_COUNT,
    LOWEST_MS,
    RESOLUTION,
    Histogram,
    Outcome,
    ReplicaTraffic,
    add_histogram,
    add_sample,
    bucket_of,
    combined,
    merge,
    outcome_of_status,
    percentile_ms,
)
from app.gateway.traffic import TrafficWindow
from app.store.gateway_reports import (
    MAX_REPORTED_REPLICAS,
    TrafficReport,
    bounded,
)

TOP_MS = LOWEST_MS * 2 ** ((BUCKET_COUNT - 2) / 8)
"""Where the last bucket, which also holds everything slower, starts."""

latencies = st.floats(min_value=0.0, max_value=2 * TOP_MS, allow_nan=False)
in_range = st.floats(min_value=LOWEST_MS, max_value=TOP_MS * 0.999, allow_nan=False)


def histogram_of(samples: list[float]) -> Histogram:
    histogram: Histogram = {}
    for ms in samples:
        add_sample(histogram, ms)
    return histogram


def exact_percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@given(st.lists(st.lists(latencies, max_size=40), max_size=6))
def test_histograms_of_parts_add_up_to_the_histogram_of_the_whole(parts: list[list[float]]) -> None:
    merged: Histogram = {}
    for part in parts:
        add_histogram(merged, histogram_of(part))
    assert merged == histogram_of([ms for part in parts for ms in part])


@given(st.lists(st.lists(in_range, max_size=30), min_size=1, max_size=5))
def test_merged_gateway_reports_are_the_figures_of_all_their_samples_together(
    gateways: list[list[float]],
) -> None:
    reports = [
        (60.0, ReplicaTraffic(requests=len(seen), ttft=histogram_of(seen))) for seen in gateways
    ]
    everything = [ms for seen in gateways for ms in seen]
    figures = merge(reports)
    alone = merge([(60.0, ReplicaTraffic(requests=len(everything), ttft=histogram_of(everything)))])

    assert figures is not None
    assert alone is not None
    assert figures.gateways == len(gateways)
    assert figures.requests == len(everything)
    assert figures.ttft_p95_ms == alone.ttft_p95_ms
    assert figures.ttft_samples == len(everything)


@given(st.lists(in_range, min_size=1, max_size=300), st.sampled_from([0.5, 0.9, 0.95, 0.99, 1.0]))
def test_a_percentile_is_within_the_stated_resolution_of_the_exact_one(
    samples: list[float], q: float
) -> None:
    estimate = percentile_ms(histogram_of(samples), q)
    exact = exact_percentile(samples, q)

    assert estimate is not None
    # A sample exactly on a bucket's edge may round into the bucket below it.
    assert abs(estimate / exact - 1) <= RESOLUTION * (1 + 1e-9) + 1e-12
    assert RESOLUTION < 0.045


def test_the_p95_of_a_known_spread() -> None:
    samples = [float(ms) for ms in range(1, 101)]  # 1..100 ms: p95 is 95 ms
    estimate = percentile_ms(histogram_of(samples), 0.95)
    assert estimate is not None
    assert abs(estimate - 95) <= 95 * RESOLUTION
    assert percentile_ms({}, 0.95) is None


def test_out_of_range_latencies_land_in_the_end_buckets() -> None:
    assert bucket_of(0.0) == bucket_of(-3.0) == bucket_of(float("nan")) == 0
    assert bucket_of(float("inf")) == bucket_of(10 * TOP_MS) == BUCKET_COUNT - 1
    assert 0 < bucket_of(LOWEST_MS) < bucket_of(1.0) < bucket_of(1000.0) < BUCKET_COUNT - 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_slides_and_forgets_what_is_older_than_it() -> None:
    clock = FakeClock()
    window = TrafficWindow(window_s=60.0, slots=12, clock=clock)
    window.record("slow-1", Outcome.ANSWERED, ttft_s=2.0, latency_s=3.0)
    clock.now += 30
    window.record("slow-1", Outcome.FAILED)
    window.record("fast-1", Outcome.ANSWERED, ttft_s=0.01)

    seen = window.report()
    assert (seen["slow-1"].requests, seen["slow-1"].errors) == (2, 1)
    assert sum(seen["slow-1"].ttft.values()) == 1

    clock.now += 35  # the first request is 65 s old, the others 35 s
    seen = window.report()
    assert (seen["slow-1"].requests, seen["slow-1"].errors, seen["slow-1"].ttft) == (1, 1, {})
    assert seen["fast-1"].requests == 1

    clock.now += 30  # everything is older than the window: forgotten
    assert window.report() == {}


def test_a_slot_is_reused_for_new_samples_once_the_window_has_passed_it() -> None:
    clock = FakeClock()
    window = TrafficWindow(window_s=60.0, slots=12, clock=clock)
    window.record("r-1", Outcome.ANSWERED, latency_s=1.0)
    clock.now += 60.0  # the same slot of the ring, one turn later
    window.record("r-1", Outcome.ANSWERED, latency_s=0.001)
    assert window.report()["r-1"] == ReplicaTraffic(requests=1, latency={bucket_of(1.0): 1})


def test_a_cancel_is_neither_a_request_nor_an_error_and_engine_failures_are_errors() -> None:
    window = TrafficWindow(clock=FakeClock())
    window.record("r-1", Outcome.CANCELLED, ttft_s=0.5)
    window.record("r-1", Outcome.ANSWERED)
    window.record("r-1", Outcome.FAILED)
    seen = window.report()["r-1"]
    assert (seen.requests, seen.errors, seen.cancelled) == (2, 1, 1)
    figures = merge([(60.0, seen)])
    assert figures is not None
    assert figures.error_rate == 0.5


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.ANSWERED),
        (400, Outcome.ANSWERED),  # the client's bad request, properly refused
        (404, Outcome.ANSWERED),
        (413, Outcome.ANSWERED),
        (429, Outcome.FAILED),  # the engine is overloaded
        (500, Outcome.FAILED),
        (502, Outcome.FAILED),
        (503, Outcome.FAILED),
    ],
)
def test_an_engine_answer_is_a_failure_when_the_engine_is_at_fault(
    status: int, outcome: Outcome
) -> None:
    assert outcome_of_status(status) is outcome


def test_no_report_gives_no_figures_and_reports_without_the_replica_give_zero_requests() -> None:
    assert merge([]) is None
    figures = merge([(60.0, None), (30.0, None)])
    assert figures is not None
    assert (figures.gateways, figures.window_s, figures.requests, figures.error_rate) == (
        2,
        60.0,
        0,
        None,
    )
    assert figures.ttft_p95_ms is None


@pytest.mark.parametrize(
    "hostile",
    [
        b'{"requests": 1, "errors": 2}',  # more errors than requests
        b'{"requests": -1}',
        b'{"ttft": {"185": 1}}',  # no such bucket
        b'{"ttft": {"-1": 1}}',
        b'{"ttft": {"3": -5}}',
        b'{"ttft": {"x": 1}}',
        b'{"requests": 1e400}',
        b'{"requests": 10000000000000000000}',
        b'{"surprise": 1}',
        b"[1, 2]",
    ],
)
def test_a_hostile_replica_report_is_refused(hostile: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(hostile, type=ReplicaTraffic)


def test_a_report_has_a_bounded_window_and_number_of_replicas() -> None:
    too_many = {f"r-{n}": {} for n in range(MAX_REPORTED_REPLICAS + 1)}
    for hostile in (
        {"window_s": 0, "replicas": {}},
        {"window_s": 1e9, "replicas": {}},
        {"window_s": 60, "replicas": too_many},
        {"window_s": 60, "replicas": {"": {}}},
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(hostile, TrafficReport)


def test_a_gateway_reports_only_its_busiest_replicas_beyond_the_bound() -> None:
    replicas = {f"r-{n}": ReplicaTraffic(requests=n) for n in range(MAX_REPORTED_REPLICAS + 10)}
    kept = bounded(TrafficReport(window_s=60.0, replicas=replicas)).replicas
    assert len(kept) == MAX_REPORTED_REPLICAS
    assert "r-9" not in kept
    assert f"r-{MAX_REPORTED_REPLICAS + 9}" in kept
    encoded = msgspec.json.encode(TrafficReport(window_s=60.0, replicas=kept))
    assert msgspec.json.decode(encoded, type=TrafficReport).replicas == kept


@given(st.lists(st.lists(st.lists(in_range, max_size=10), max_size=4), min_size=1, max_size=4))
def test_a_revision_is_its_replicas_added_up_per_gateway_and_counts_gateways_once(
    gateways: list[list[list[float]]],
) -> None:
    """Per gateway, a list of replicas, each a list of TTFTs: a revision's figures are those
    of one replica that got every request, seen by as many gateways as reported."""
    reports = [
        (
            60.0,
            combined(
                ReplicaTraffic(requests=len(seen), errors=len(seen) // 3, ttft=histogram_of(seen))
                for seen in replicas
            ),
        )
        for replicas in gateways
    ]
    everything = [ms for replicas in gateways for seen in replicas for ms in seen]
    errors = sum(len(seen) // 3 for replicas in gateways for seen in replicas)
    one = ReplicaTraffic(requests=len(everything), errors=errors, ttft=histogram_of(everything))

    figures = merge(reports)
    alone = merge([(60.0, one)] + [(60.0, None)] * (len(gateways) - 1))

    assert figures == alone
    assert figures is not None
    assert figures.gateways == len(gateways)
    assert combined([]) is None
