"""What gateways measure of each replica's requests, and how their reports add up.

Latencies are counted in a fixed logarithmic histogram: bucket 0 holds everything under
``LOWEST_MS``; bucket ``i >= 1`` holds ``[LOWEST_MS * 2**((i-1)/8), LOWEST_MS * 2**(i/8))``,
eight buckets an octave, up to about 14 minutes (the last bucket also holds anything
slower). Every gateway uses the same buckets, so adding histograms bucket by bucket is the
histogram of all their samples together, exactly: percentiles do not merge, histograms do.

A percentile is read as the geometric middle of the bucket that holds the sample of that
rank (nearest rank, as ``ceil(q * n)``), so it is within ``RESOLUTION`` (4.4 %) of that
sample's true value, for any mix of gateways.

``ReplicaTraffic`` is what one gateway reports of one replica over its window; it is also
the wire form in ``gateway_reports.traffic``, so every field is bounded for a decoder that
must treat the row as hostile. ``merge`` adds the reports of several gateways up into
``TrafficFigures``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Annotated, Protocol

import msgspec

BUCKETS_PER_OCTAVE = 8
LOWEST_MS = 0.1
OCTAVES = 23
BUCKET_COUNT = 1 + OCTAVES * BUCKETS_PER_OCTAVE
"""185: up to ``LOWEST_MS * 2**23`` ms, 839 s."""
RESOLUTION = 2 ** (1 / (2 * BUCKETS_PER_OCTAVE)) - 1
"""The largest relative error of a percentile read from a histogram (inside its range)."""
_LAST = BUCKET_COUNT - 1
_SCALE = BUCKETS_PER_OCTAVE / math.log(2)
_LAST_FROM_MS = LOWEST_MS * 2 ** ((_LAST - 1) / BUCKETS_PER_OCTAVE)

MAX_COUNT = 10**15
MAX_WINDOW_S = 3600.0
P95 = 0.95

BucketIndex = Annotated[int, msgspec.Meta(ge=0, le=_LAST)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Histogram = dict[int, int]
"""Sparse: bucket index -> samples in it; empty buckets are left out."""
WireHistogram = Annotated[dict[BucketIndex, Count], msgspec.Meta(max_length=BUCKET_COUNT)]
WindowSeconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_WINDOW_S)]


class Outcome(Enum):
    """How one request to one replica ended, as far as the replica is concerned."""

    ANSWERED = "answered"
    """A whole answer or a finished stream, 2xx, or a 4xx other than 429 (the client's
    request was at fault, not the engine)."""
    FAILED = "failed"
    """The engine's fault: a 5xx or 429, no answer (connection refused, reset, timed out),
    or an answer that broke off."""
    CANCELLED = "cancelled"
    """The client went away first: neither a request answered nor an engine error."""
    ABANDONED = "abandoned"
    """Cancelled before any of the answer came: the client went away while the replica had
    sent no head, no first chunk of a stream, or not the whole of an answer that is not
    streamed. Counted as cancelled, and apart: a hung replica's clients give up so."""


def outcome_of_status(status: int) -> Outcome:
    """An engine's answer by its status: 5xx and 429 (overloaded) are the engine's
    failures; other 4xx are the client's bad requests, answered properly."""
    return Outcome.FAILED if status >= 500 or status == 429 else Outcome.ANSWERED


def bucket_of(ms: float) -> int:
    """The histogram bucket of a latency in milliseconds."""
    if not ms >= LOWEST_MS:  # NaN, and a negative time (a clock step), land here too
        return 0
    if ms >= _LAST_FROM_MS:  # infinity too
        return _LAST
    return min(int(math.log(ms / LOWEST_MS) * _SCALE) + 1, _LAST)


def bucket_value_ms(index: int) -> float:
    """What a sample in bucket ``index`` is read as: its geometric middle (bucket 0: the
    bottom of the range)."""
    if index <= 0:
        return LOWEST_MS
    return LOWEST_MS * 2 ** ((index - 0.5) / BUCKETS_PER_OCTAVE)


def add_sample(histogram: Histogram, ms: float) -> None:
    index = bucket_of(ms)
    histogram[index] = histogram.get(index, 0) + 1


def add_histogram(total: Histogram, more: Mapping[int, int]) -> None:
    for index, count in more.items():
        total[index] = total.get(index, 0) + count


def percentile_ms(histogram: Mapping[int, int], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0 < q <= 1), or None without samples."""
    samples = sum(histogram.values())
    if samples == 0:
        return None
    rank = max(1, math.ceil(q * samples))
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return bucket_value_ms(index)
    raise AssertionError("unreachable: the ranks add up to the samples")


class ReplicaTraffic(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One gateway's requests to one replica over its window."""

    requests: Count = 0
    """Answered and failed, not cancelled."""
    errors: Count = 0
    cancelled: Count = 0
    abandoned: Count = 0
    """Of ``cancelled``, those cancelled before any of the answer came (``ABANDONED``)."""
    ttft: WireHistogram = {}
    """Time to the first chunk of a streamed 2xx answer, from sending the request."""
    tpot: WireHistogram = {}
    """Time per output token of a finished streamed 2xx answer."""
    latency: WireHistogram = {}
    """Time to the last byte of a 2xx answer, streamed or not, from sending the request."""

    def __post_init__(self) -> None:
        if self.errors > self.requests:
            raise ValueError(f"{self.errors} errors of only {self.requests} requests")
        if self.abandoned > self.cancelled:
            raise ValueError(f"{self.abandoned} abandoned of only {self.cancelled} cancelled")


class TrafficFigures(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's traffic over every gateway that reported: sums and percentiles of the
    merged histograms."""

    window_s: float
    gateways: int
    """Gateways whose fresh reports were merged (those that sent the replica nothing
    included)."""
    requests: int
    errors: int
    cancelled: int
    error_rate: float | None
    """``errors / requests``; None without requests."""
    ttft_p95_ms: float | None
    ttft_samples: int
    tpot_p95_ms: float | None
    tpot_samples: int
    latency_p95_ms: float | None
    latency_samples: int
    abandoned: int = 0
    """Of ``cancelled``, those cancelled before any of the answer came."""
    unlisted: int = 0
    """Of ``gateways``, those whose report, past the replicas a report lists, left out
    replicas that may be some of these (``app.domain.traffic_left_out.may_lack``): the
    figures may lack requests those gateways sent them."""


class Counted(Protocol):
    """What adds up: a replica's traffic in a report, or one slot of a gateway's window."""

    @property
    def requests(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def cancelled(self) -> int: ...
    @property
    def abandoned(self) -> int: ...
    @property
    def ttft(self) -> Mapping[int, int]: ...
    @property
    def tpot(self) -> Mapping[int, int]: ...
    @property
    def latency(self) -> Mapping[int, int]: ...


def combined(parts: Iterable[Counted]) -> ReplicaTraffic | None:
    """Several parts as one (a gateway's slots of a replica, or what it saw of a revision's
    replicas): counts and histograms added up; None without any part."""
    parts = list(parts)
    if not parts:
        return None
    ttft: Histogram = {}
    tpot: Histogram = {}
    latency: Histogram = {}
    for part in parts:
        add_histogram(ttft, part.ttft)
        add_histogram(tpot, part.tpot)
        add_histogram(latency, part.latency)
    return ReplicaTraffic(
        requests=sum(p.requests for p in parts),
        errors=sum(p.errors for p in parts),
        cancelled=sum(p.cancelled for p in parts),
        abandoned=sum(p.abandoned for p in parts),
        ttft=ttft,
        tpot=tpot,
        latency=latency,
    )


def merge(reports: Iterable[tuple[float, ReplicaTraffic | None]]) -> TrafficFigures | None:
    """Add up ``(window_s, what that gateway saw of the replica or None)`` per gateway;
    None when no gateway reported. The window is the longest of theirs."""
    gateways = 0
    window_s = 0.0
    seen: list[ReplicaTraffic] = []
    for gateway_window_s, traffic in reports:
        gateways += 1
        window_s = max(window_s, gateway_window_s)
        if traffic is not None:
            seen.append(traffic)
    if gateways == 0:
        return None
    total = combined(seen) or ReplicaTraffic()
    return TrafficFigures(
        window_s=window_s,
        gateways=gateways,
        requests=total.requests,
        errors=total.errors,
        cancelled=total.cancelled,
        abandoned=total.abandoned,
        error_rate=total.errors / total.requests if total.requests else None,
        ttft_p95_ms=percentile_ms(total.ttft, P95),
        ttft_samples=sum(total.ttft.values()),
        tpot_p95_ms=percentile_ms(total.tpot, P95),
        tpot_samples=sum(total.tpot.values()),
        latency_p95_ms=percentile_ms(total.latency, P95),
        latency_samples=sum(total.latency.values()),
    )
