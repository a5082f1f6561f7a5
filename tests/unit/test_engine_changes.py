"""Which shard state changes exist, and how an engine's exit is described."""

from __future__ import annotations

import pytest

from agent.engines.changes import can_transition, describe_exit
from agent.engines.records import ShardState

STARTING, READY, FAILED, STOPPED = (
    ShardState.STARTING,
    ShardState.READY,
    ShardState.FAILED,
    ShardState.STOPPED,
)


@pytest.mark.parametrize(
    ("current", "target"),
    [(STARTING, READY), (STARTING, FAILED), (READY, FAILED), (FAILED, STOPPED), (READY, STOPPED)],
)
def test_allowed_transitions(current: ShardState, target: ShardState) -> None:
    assert can_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [(FAILED, READY), (READY, STARTING), (READY, READY), (STOPPED, STARTING), (STOPPED, FAILED)],
)
def test_refused_transitions(current: ShardState, target: ShardState) -> None:
    assert not can_transition(current, target)


def test_exits_are_described_by_code_signal_or_as_unknown() -> None:
    assert describe_exit(3) == "engine exited with code 3"
    assert describe_exit(-9) == "engine was killed by SIGKILL"
    assert "unknown" in describe_exit(None)
