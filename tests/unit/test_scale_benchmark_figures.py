"""The figures ``benchmarks/agents.py``, ``benchmarks/adoption.py`` and
``benchmarks/reconcile.py`` derive for ``docs/scaling.md``: heartbeat CPU per 1,000 agents
and per heartbeat, the leader's event rate during a mass restart, and the fleet that
does not fit."""

from __future__ import annotations

import pytest

from benchmarks.adoption import EventRate, event_rate
from benchmarks.agents import cpu_ms_per_heartbeat, cpu_per_thousand
from benchmarks.reconcile import fleet


def test_heartbeat_cpu_is_scaled_to_a_thousand_agents_and_to_one_heartbeat() -> None:
    assert cpu_per_thousand(0.6, agents=3_000) == 0.2
    assert cpu_per_thousand(0.6, agents=0) == 0.0
    # 0.4 cores for 1,000 acks a second: 0.4 ms of CPU each.
    assert cpu_ms_per_heartbeat(0.4, acks_per_s=1_000) == 0.4
    assert cpu_ms_per_heartbeat(0.4, acks_per_s=0) == 0.0


def test_the_event_rate_spans_the_first_to_the_last_second_with_events() -> None:
    # Seconds 100 and 103 had events, 101 and 102 none: four seconds, both ends counted.
    rate = event_rate([(100, 50), (103, 350)])

    assert rate == EventRate(events=400, seconds=4, per_s=100.0, peak_per_s=350)


def test_no_events_is_no_rate() -> None:
    assert event_rate([]) is None


def test_a_fleet_of_more_replicas_than_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        fleet(nodes=2, replicas=17)
