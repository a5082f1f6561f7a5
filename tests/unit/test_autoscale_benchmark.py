"""The autoscaling benchmark's verdict: a share just under 99 % is not the goal met, however
it rounds."""

from __future__ import annotations

from benchmarks.autoscale import Run, against_peak, meets_goal, share_down


def autoscaled(within: int, requests: int, failed: int = 0, replica_seconds: float = 1778.0) -> Run:
    return Run(
        name="autoscaled",
        replicas="1-10",
        requests=requests,
        within_slo=within,
        within_slo_pct=share_down(within, requests),
        failed=failed,
        failures_by_kind={},
        ttft_p50_ms=None,
        ttft_p95_ms=None,
        ttft_p99_ms=None,
        replica_seconds=replica_seconds,
        scale_events=52,
        outside_slo=[],
        outside_slo_held=0,
        scale_path=[1],
        timeline_replicas=[],
        timeline_ttft_p95_ms=[],
    )


def test_a_share_is_shown_rounded_down_so_that_it_never_reads_as_more_than_it_is() -> None:
    assert share_down(2276, 2299) == 98.99  # 98.9996 %, which rounds to 99.00
    assert share_down(2284, 2299) == 99.34  # 99.3475 %
    assert share_down(2299, 2299) == 100.0
    assert share_down(0, 0) == 0.0


def test_the_goal_counts_requests_rather_than_the_rounded_share() -> None:
    assert not meets_goal(autoscaled(2276, 2299), 59.3)  # 23 out: 98.9996 %
    assert meets_goal(autoscaled(2277, 2299), 59.3)  # 22 out: 99.04 %
    assert meets_goal(autoscaled(99, 100), 60.0)  # exactly 99 % at exactly 60 %
    assert not meets_goal(autoscaled(2299, 2299, failed=1), 59.3)
    assert not meets_goal(autoscaled(2299, 2299), 60.04)


def test_the_goal_counts_replica_seconds_rather_than_the_rounded_share() -> None:
    peak = autoscaled(2299, 2299, replica_seconds=3000.0)

    assert against_peak(autoscaled(2299, 2299, replica_seconds=1801.2), peak) == (60.0, False)
    assert against_peak(autoscaled(2299, 2299, replica_seconds=1800.0), peak) == (60.0, True)
    assert against_peak(autoscaled(2276, 2299, replica_seconds=1778.0), peak) == (59.3, False)
