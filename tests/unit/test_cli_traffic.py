"""The traffic sections of ``llmgw-cli replica`` and ``llmgw-cli model``: what they say,
within 80 columns, and when their figures may be partial."""

from __future__ import annotations

import io

from rich.console import Console

from cli.traffic import milliseconds, print_traffic, print_traffic_by_revision, revision_line
from cli.views import ReplicaTrafficView


def rendered(traffic: ReplicaTrafficView | None, width: int = 80) -> str:
    output = io.StringIO()
    print_traffic(traffic, Console(file=output, width=width, highlight=False, color_system=None))
    return output.getvalue()


def test_a_busy_replica_s_figures_fit_in_80_columns() -> None:
    traffic = ReplicaTrafficView(
        window_s=60.0,
        gateways=12,
        requests=123_456_789,
        errors=1_234_567,
        cancelled=98_765_432,
        abandoned=12_345_678,
        error_rate=1_234_567 / 123_456_789,
        ttft_p95_ms=182_345.6,
        ttft_samples=123_456_789,
        tpot_p95_ms=21.43,
        tpot_samples=123_456_789,
        latency_p95_ms=3.2,
        latency_samples=123_456_789,
    )
    text = rendered(traffic)
    assert text.splitlines() == [
        "traffic (last 60 s, 12 gateways):",
        "  requests:    123,456,789",
        "  failed:      1,234,567 (1.0 %)",
        "  cancelled:   98,765,432 by their clients (not counted above)",
        "  abandoned:   12,345,678 of those before any of the answer came",
        "  TTFT p95:    182 s (123,456,789 streams)",
        "  TPOT p95:    21 ms (123,456,789 streams)",
        "  latency p95: 3.2 ms (123,456,789 answers)",
    ]
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_replica_without_requests_or_reports_says_so() -> None:
    quiet = rendered(ReplicaTrafficView(window_s=60.0, gateways=1))
    assert quiet.splitlines() == [
        "traffic (last 60 s, 1 gateway):",
        "  requests:    0",
        "  failed:      0",
        "  cancelled:   0 by their clients (not counted above)",
        "  abandoned:   0 of those before any of the answer came",
        "  TTFT p95:    - (no streams)",
        "  TPOT p95:    - (no streams)",
        "  latency p95: - (no answers)",
    ]
    assert rendered(None) == "traffic: no gateway reports in the last 5 s\n"


def test_latencies_keep_three_significant_figures_at_most() -> None:
    assert [milliseconds(ms) for ms in (0.1234, 8.46, 182.4, 1234.0, 61_000.0)] == [
        "0.12 ms",
        "8.5 ms",
        "182 ms",
        "1.23 s",
        "61 s",
    ]


def test_a_models_traffic_reads_one_line_per_revision_newest_first_within_80_columns() -> None:
    canary = ReplicaTrafficView(
        window_s=60.0,
        gateways=2,
        requests=123_456_789,
        errors=1_234_567,
        error_rate=1_234_567 / 123_456_789,
        ttft_p95_ms=182_345.6,
        ttft_samples=5,
        tpot_p95_ms=21.43,
        tpot_samples=5,
    )
    stable = ReplicaTrafficView(
        window_s=60.0, gateways=2, requests=40, error_rate=0.0, latency_p95_ms=950.0
    )
    idle = ReplicaTrafficView(window_s=60.0, gateways=2)
    output = io.StringIO()
    console = Console(file=output, width=80, highlight=False, color_system=None)

    print_traffic_by_revision({"1": stable, "10": canary, "2": idle}, console)
    print_traffic_by_revision({}, console)

    assert output.getvalue().splitlines() == [
        "traffic by revision (last 60 s, 2 gateways):",
        "  rev 10: 123,456,789 requests, 1.0 % failed, TTFT p95 182 s, TPOT p95 21 ms",
        "  rev 2: 0 requests",
        "  rev 1: 40 requests, 0 % failed, latency p95 950 ms",
        "traffic: none (no gateway reports in the last 5 s, or no replica)",
    ]
    assert max(len(line) for line in output.getvalue().splitlines()) <= 80


def test_one_request_is_said_in_the_singular() -> None:
    one = ReplicaTrafficView(window_s=60.0, gateways=1, requests=1, error_rate=0.0)

    assert revision_line("1", one) == "rev 1: 1 request, 0 % failed"


def test_a_replica_a_crowded_report_may_have_left_out_says_its_figures_are_partial() -> None:
    traffic = ReplicaTrafficView(window_s=60.0, gateways=3, requests=5, unlisted=1)

    lines = rendered(traffic).splitlines()

    assert lines[:3] == [
        "traffic (last 60 s, 3 gateways):",
        "  partial:     1 gateway's report may have left it out",
        "  requests:    5",
    ]
    assert rendered(ReplicaTrafficView(window_s=60.0, gateways=3, unlisted=0)) == rendered(
        ReplicaTrafficView(window_s=60.0, gateways=3)
    )


def test_a_revision_whose_replicas_reports_may_have_left_out_says_so_under_its_line() -> None:
    canary = ReplicaTrafficView(window_s=60.0, gateways=12, requests=3, error_rate=0.0, unlisted=12)
    stable = ReplicaTrafficView(window_s=60.0, gateways=12, requests=40, error_rate=0.0)
    output = io.StringIO()
    console = Console(file=output, width=80, highlight=False, color_system=None)

    print_traffic_by_revision({"1": stable, "2": canary}, console)

    assert output.getvalue().splitlines() == [
        "traffic by revision (last 60 s, 12 gateways):",
        "  rev 2: 3 requests, 0 % failed",
        "    partial: 12 gateways' reports may have left replicas of it out",
        "  rev 1: 40 requests, 0 % failed",
    ]
