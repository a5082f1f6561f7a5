"""Stories of a start an agent refused: given the log, when the node answers a start it was
sent with a refusal, then the shard fails at once with the node's reason, or nothing is
recorded when the answer does not speak for a shard of that node still to start."""

from __future__ import annotations

import pytest

from app.domain.agent_reports import decide, shard_reported
from app.domain.events import (
    AnyEvent,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaStopping,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
)
from app.domain.reports import CommandAnswered, ShardPhaseReport
from app.domain.start_refusals import MAX_REFUSAL_CHARS
from app.domain.state import ShardPhase
from tests.unit.test_domain_agent_reports import NODE, PLACED, PORT, given, gpu, registered

START = "start-llama-1-0"
TAKEN = f"port {PORT} is already used by replica m-2 shard 0 (pid 4242)"


def refusal(
    command_id: str = START,
    error: str | None = TAKEN,
    *,
    node_id: str = NODE,
    sent: bool = True,
    ok: bool = False,
) -> CommandAnswered:
    return CommandAnswered(node_id=node_id, command_id=command_id, ok=ok, error=error, sent=sent)


def failed(error: str = f"start refused: {TAKEN}") -> ShardFailed:
    return ShardFailed(replica_id="llama-1", shard_index=0, node_id=NODE, error=error)


def test_a_start_its_node_refused_fails_the_shard_with_the_node_s_reason() -> None:
    """Before, the answer was only logged: the replica waited out its startup timeout (ten
    minutes by default) and ended "timed out", the node's reason nowhere in the log."""
    state = given(registered(gpu(0)), PLACED)

    assert decide(state, refusal()) == [("replica-llama-1", failed())]


def test_a_shard_its_agent_stopped_and_that_its_node_refuses_to_start_again_fails() -> None:
    state = given(
        registered(gpu(0)),
        PLACED,
        ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE),
        ShardStopped(replica_id="llama-1", shard_index=0, node_id=NODE, reason="agent stopped"),
    )
    reason = "GPU(s) [0] are no longer listed by the driver"

    assert decide(state, refusal(error=reason)) == [
        ("replica-llama-1", failed(f"start refused: {reason}"))
    ]


def test_the_shard_of_a_replica_of_several_is_found_by_its_whole_command_id() -> None:
    """Replica ids hold dashes: ``start-llama-1-1`` is shard 1 of ``llama-1``."""
    two = ReplicaPlaced(
        replica_id="llama-1",
        model="llama",
        number=1,
        shards=(
            ShardPlacement(index=0, node_id="gpu-2", gpus=(0,), port=PORT),
            ShardPlacement(index=1, node_id=NODE, gpus=(0,), port=PORT),
        ),
    )
    state = given(registered(gpu(0)), two)

    [(_, event)] = decide(state, refusal("start-llama-1-1"))

    assert isinstance(event, ShardFailed)
    assert (event.shard_index, event.node_id) == (1, NODE)
    assert decide(state, refusal("start-llama-1-0")) == []  # gpu-2's shard, not gpu-1's


@pytest.mark.parametrize(
    "answer",
    [
        refusal(sent=False),
        refusal(ok=True, error=None),
        refusal(node_id="gpu-2"),
        refusal("start-llama-9-0"),
        refusal("start-llama-1-1"),
        refusal("start-llama-1-00"),
        refusal("start-llama-1-" + "9" * 5000),
        refusal("start-"),
        refusal("llama-1-0"),
        refusal("stop-llama-1-0"),
        refusal("stray-llama-1-0-4242"),
    ],
    ids=[
        "a command never sent to the node",
        "a success",
        "another node's shard",
        "an unknown replica",
        "an unknown shard",
        "a shard index spelled otherwise",
        "a shard index of 5000 digits",
        "a start of nothing",
        "a replica id alone",
        "a stop",
        "a stray's stop",
    ],
)
def test_an_answer_that_does_not_refuse_a_start_of_this_nodes_shard_changes_nothing(
    answer: CommandAnswered,
) -> None:
    assert decide(given(registered(gpu(0)), PLACED), answer) == []


@pytest.mark.parametrize(
    "since",
    [
        ShardStarting(replica_id="llama-1", shard_index=0, node_id=NODE, pid=4242),
        ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE),
        failed("CUDA out of memory"),
        ShardStopped(replica_id="llama-1", shard_index=0, node_id=NODE, exit_code=0),
        ReplicaFailed(replica_id="llama-1", reason="shard 1 failed"),
        ReplicaStopping(replica_id="llama-1", reason="scaled down"),
    ],
    ids=["starting", "ready", "failed", "stopped", "replica failed", "replica stopping"],
)
def test_a_refusal_of_a_shard_that_has_moved_on_changes_nothing(since: AnyEvent) -> None:
    """A start the agent remembers refusing, answered again to a start re-sent after the
    shard launched, ended or left its replica's start, says nothing of it now."""
    state = given(registered(gpu(0)), PLACED, since)

    assert decide(state, refusal()) == []


def test_a_refusal_after_the_failed_status_of_the_same_start_is_not_recorded_again() -> None:
    state = given(registered(gpu(0)), PLACED, failed("exited with code 1"))

    assert decide(state, refusal()) == []


def test_a_failed_status_after_the_refusal_is_not_recorded_again() -> None:
    state = given(registered(gpu(0)), PLACED, failed())
    status = ShardPhaseReport(
        replica_id="llama-1", shard_index=0, phase=ShardPhase.FAILED, error="refused"
    )

    assert shard_reported(state, NODE, status, port=PORT) == []


def test_the_same_refusal_answered_again_is_recorded_once() -> None:
    """An agent answers a start sent again with the result it remembers."""
    [(_, first)] = decide(given(registered(gpu(0)), PLACED), refusal())

    assert decide(given(registered(gpu(0)), PLACED, first), refusal()) == []


def test_a_long_reason_is_cut_and_a_missing_one_is_said() -> None:
    state = given(registered(gpu(0)), PLACED)

    [(_, long)] = decide(state, refusal(error="x" * 2000))
    [(_, blank)] = decide(state, refusal(error=" "))
    [(_, none)] = decide(state, refusal(error=None))

    assert isinstance(long, ShardFailed)
    assert long.error == "start refused: " + "x" * (MAX_REFUSAL_CHARS - 3) + "..."
    assert [e.error for e in (blank, none) if isinstance(e, ShardFailed)] == [
        "start refused: no reason given"
    ] * 2


def test_a_shard_outside_its_node_s_port_range_is_left_to_the_port_range_rule() -> None:
    """The log knows the node's range excludes the port: the reconciler stops the replica
    and replaces it within the range, without backoff (tests/unit/test_reconcile_port_range.py);
    a failure would count against the model's backoff and delay the replacement."""
    elsewhere = ReplicaPlaced(
        replica_id="llama-1",
        model="llama",
        number=1,
        shards=(ShardPlacement(index=0, node_id=NODE, gpus=(0,), port=21000),),
    )
    outside = "port 21000 is outside this node's port range 20000-20099"

    assert decide(given(registered(gpu(0)), elsewhere), refusal(error=outside)) == []
