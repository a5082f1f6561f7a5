"""What one connection may say about a shard's phase: the engine's life, forward, and a new
launch only for a start."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from agent.engines.changes import can_transition
from agent.engines.records import ShardState as AgentShardState
from app.hub.shard_lives import FORWARD, MAX_ENDED_KEPT, MAX_SHARDS_STARTED_BEFORE, ShardLives
from wire.messages import ShardReport, ShardState, ShardStatus

PHASES: tuple[ShardState, ...] = get_args(ShardState)


def status(state: ShardState, replica_id: str = "llama-1", shard_index: int = 0) -> ShardStatus:
    return ShardStatus(replica_id=replica_id, shard_index=shard_index, state=state, port=20001)


def listed(state: ShardState) -> ShardReport:
    return ShardReport(
        replica_id="llama-1",
        shard_index=0,
        model="llama",
        port=20001,
        gpus=(0,),
        pid=4242,
        state=state,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def refusals(lives: ShardLives, states: list[ShardState]) -> list[str | None]:
    return [lives.refusal(status(state)) for state in states]


def test_the_steps_forward_are_those_the_agent_takes() -> None:
    for before in PHASES:
        for after in PHASES:
            agent = can_transition(AgentShardState(before), AgentShardState(after))
            assert (after in FORWARD[before]) == agent, (before, after)


def test_one_engine_life_reported_forward_is_taken() -> None:
    assert refusals(ShardLives(), ["starting", "ready", "failed", "stopped"]) == [None] * 4


def test_a_shard_flipped_between_two_phases_is_refused_naming_the_shard_and_both() -> None:
    lives = ShardLives()
    # The first word is a launch whose start may have come before the connection; no more.
    answers = refusals(lives, ["starting", "ready", "starting"])
    assert answers[:2] == [None, None]
    assert answers[2] == "ready -> starting for shard llama-1/0: no start_shard explains it"


def test_the_same_phase_again_is_taken_and_spends_no_launch() -> None:
    """A stop of a shard already stopped is answered ``stopped`` again; a phase said again
    changes nothing, so no launch is spent on it and nothing is refused."""
    lives = ShardLives()
    lives.listed([listed("ready")])
    assert refusals(lives, ["ready", "ready", "stopped", "stopped", "stopped"]) == [None] * 5
    assert refusals(lives, ["starting"]) == [None]  # the free launch is still there
    assert refusals(lives, ["ready", "starting"])[1] is not None


def test_each_start_sent_on_the_connection_explains_one_new_launch() -> None:
    lives = ShardLives()
    lives.listed([listed("ready")])
    lives.start_sent("llama-1", 0)
    life = ["failed", "starting", "ready", "stopped", "starting", "ready", "stopped"]
    assert refusals(lives, life) == [None] * len(life)  # two launches: the start, the free one
    assert lives.refusal(status("starting")) is not None


def test_the_hello_sets_the_phase_the_next_status_follows() -> None:
    lives = ShardLives()
    lives.listed([listed("starting")])  # an engine re-attached after an agent restart
    assert refusals(lives, ["ready", "failed"]) == [None, None]
    lives = ShardLives()
    lives.listed([listed("ready")])
    assert refusals(lives, ["starting", "ready", "starting"])[2] is not None


def test_a_shard_the_hello_did_not_list_was_launched_after_it() -> None:
    lives = ShardLives()
    assert lives.refusal(status("ready")) is None  # the one launch a start before may explain
    lives = ShardLives()
    lives.listed([listed("failed")])
    assert refusals(lives, ["failed", "starting", "ready", "starting"]) == [
        None,  # said again: nothing changes
        None,  # the one launch a start before may explain
        None,
        "ready -> starting for shard llama-1/0: no start_shard explains it",
    ]
    lives = ShardLives()
    lives.start_sent("llama-1", 0)
    assert refusals(lives, ["failed", "starting", "ready", "starting"])[3] is not None


def test_shards_are_judged_apart() -> None:
    lives = ShardLives()
    for index in range(3):
        assert lives.refusal(status("starting", shard_index=index)) is None
        assert lives.refusal(status("ready", shard_index=index)) is None
    assert lives.refusal(status("starting", shard_index=1)) is not None
    assert lives.refusal(status("failed", shard_index=2)) is None


def test_shards_neither_listed_nor_started_are_taken_up_to_the_allowance_then_refused() -> None:
    """Before, each made-up shard spent a free launch of its own and was taken: the memory
    forgot the oldest, and what a status reaches (the live view) grew by one a status. Now
    the hello's shards, the starts sent and ``MAX_SHARDS_STARTED_BEFORE`` others are all a
    connection may speak of."""
    lives = ShardLives()
    lives.listed([listed("ready")])
    lives.start_sent("started-on-it", 0)
    for index in range(MAX_SHARDS_STARTED_BEFORE):
        assert lives.refusal(status("starting", replica_id=f"made-up-{index}")) is None

    assert lives.refusal(status("starting", replica_id="one-more")) == (
        f"more than {MAX_SHARDS_STARTED_BEFORE} shards neither in the hello nor started on "
        "this connection: one-more/0"
    )
    assert len(lives) == 2 + MAX_SHARDS_STARTED_BEFORE
    # What the connection was told of, or listed, is still taken.
    assert lives.refusal(status("starting", replica_id="started-on-it")) is None
    assert lives.refusal(status("stopped")) is None
    assert lives.refusal(status("ready", replica_id="made-up-0")) is None


def test_a_long_connection_speaks_of_every_shard_it_was_told_to_start() -> None:
    """Shards the control plane starts on the connection count against no allowance, however
    many come and go over its life; a listed shard is still remembered at the end."""
    lives = ShardLives()
    lives.listed([listed("ready")])
    for index in range(3 * MAX_SHARDS_STARTED_BEFORE):
        lives.start_sent(f"r-{index}", 0)
        for state in ("starting", "ready", "stopped"):
            assert lives.refusal(status(state, replica_id=f"r-{index}")) is None
    assert refusals(lives, ["failed", "stopped"]) == [None, None]
    assert lives.refusal(status("starting")) is None  # its one free launch, still unspent
    assert lives.refusal(status("starting", replica_id="from-before")) is None


def test_a_long_connection_remembers_a_bounded_number_of_ended_shards() -> None:
    """Before, every shard started on a connection was remembered until it closed: a node
    connected for months held one entry per engine it ever ran. The oldest ended ones are
    forgotten; what runs, and what the hello listed, is kept."""
    lives = ShardLives()
    lives.listed([listed("ready")])
    lives.start_sent("running-1", 0)
    assert lives.refusal(status("ready", replica_id="running-1")) is None
    for index in range(3 * MAX_ENDED_KEPT):
        lives.start_sent(f"r-{index}", 0)
        for state in ("starting", "ready", "stopped"):
            assert lives.refusal(status(state, replica_id=f"r-{index}")) is None

    assert len(lives) == 2 + MAX_ENDED_KEPT
    assert refusals(lives, ["failed", "stopped"]) == [None, None]  # the listed one, kept
    assert lives.refusal(status("stopped", replica_id="running-1")) is None
    # One forgotten and spoken of again is one first heard of in a status: it spends one
    # of the allowance, never more.
    assert lives.refusal(status("starting", replica_id="r-0")) is None
    assert lives.refusal(status("starting", replica_id="r-0")) is None  # said again
    assert lives.refusal(status("ready", replica_id="r-0")) is None


launch = st.lists(st.sampled_from(PHASES), min_size=1, max_size=4).map(
    lambda phases: sorted(set(phases), key=PHASES.index)
)
"""The statuses of one launch, as the agent sends them, some perhaps left out."""


@given(
    hello=st.sampled_from((None, *PHASES)),
    launches=st.lists(launch, min_size=1, max_size=5),
    started_before=st.booleans(),
)
def test_an_honest_agent_is_never_refused(
    hello: ShardState | None, launches: list[list[ShardState]], started_before: bool
) -> None:
    """Whatever the hello listed, and whether the first launch's start came before the
    connection or on it, every later launch following a start sent on the connection."""
    lives = ShardLives()
    if hello is not None:
        lives.listed([listed(hello)])
    for number, statuses in enumerate(launches):
        if number > 0 or not started_before:
            lives.start_sent("llama-1", 0)
        assert refusals(lives, statuses) == [None] * len(statuses)
