"""Stories of what agents say and what the log records because of it.

Given the events already in the log, when an agent reports something, then these events
(and only these) are appended: a report that changes nothing appends nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from app.domain.agent_reports import (
    agent_connected,
    agent_gone,
    decide,
    gpu_health_reported,
    identity_rejected,
    shard_reported,
)
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    GpuMarkedUnhealthy,
    GpuRecovered,
    IdentityRejected,
    NodeConnected,
    NodeDisconnected,
    NodeRegistered,
    ReplicaPlaced,
    ReplicaStartupTimedOut,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
    StrayStopped,
)
from app.domain.evolve import replay
from app.domain.reports import (
    AgentInventory,
    GpuHealth,
    IdentityClaim,
    ReportedPhase,
    ShardPhaseReport,
    ShardStatusReport,
)
from app.domain.state import ClusterState, ShardPhase

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NODE = "gpu-1"


def given(*events: AnyEvent) -> ClusterState:
    return replay(
        Recorded(
            position=n,
            stream="any",
            version=n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(seconds=n),
            meta=Meta(actor="test"),
            event=event,
        )
        for n, event in enumerate(events, start=1)
    )


def gpu(
    index: int, *, healthy: bool = True, reason: str | None = None, uuid: str | None = None
) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index}" if uuid is None else uuid,
        name="H100",
        memory_total_mib=81559,
        healthy=healthy,
        unhealthy_reason=reason,
    )


def inventory(*gpus: GpuInfo, node_id: str = NODE) -> AgentInventory:
    return AgentInventory(
        node_id=node_id,
        address="127.0.0.7",
        remote_address="127.0.0.7:51234",
        labels={"zone": "a"},
        gpus=gpus,
        port_range=(20000, 20099),
        agent_version="1.2.0",
    )


def connected(*gpus: GpuInfo, replaced_previous: bool = False) -> NodeConnected:
    return NodeConnected(
        node_id=NODE,
        address="127.0.0.7",
        remote_address="127.0.0.7:51234",
        labels={"zone": "a"},
        gpus=gpus,
        agent_version="1.2.0",
        port_range=(20000, 20099),
        replaced_previous=replaced_previous,
    )


def registered(*gpus: GpuInfo) -> NodeRegistered:
    return NodeRegistered(
        node_id=NODE,
        address="127.0.0.7",
        labels={"zone": "a"},
        gpus=gpus,
        agent_version="1.2.0",
        port_range=(20000, 20099),
    )


STREAM = f"node-{NODE}"
PORT = 20001
"""Where ``PLACED`` puts its shard."""
PLACED = ReplicaPlaced(
    replica_id="llama-1",
    model="llama",
    number=1,
    shards=(ShardPlacement(index=0, node_id=NODE, gpus=(0,), port=PORT),),
)


# -- an agent says hello -----------------------------------------------------------------


def test_a_node_seen_for_the_first_time_is_registered_then_connected() -> None:
    decision = agent_connected(given(), inventory(gpu(0)), replaced_previous=False)

    assert decision == [(STREAM, registered(gpu(0))), (STREAM, connected(gpu(0)))]


def test_a_known_node_that_reconnects_is_only_connected() -> None:
    state = given(registered(gpu(0)), connected(gpu(0)), NodeDisconnected(node_id=NODE, reason="x"))

    decision = agent_connected(state, inventory(gpu(0)), replaced_previous=False)

    assert decision == [(STREAM, connected(gpu(0)))]


def test_a_connection_that_replaced_another_says_so() -> None:
    state = given(registered(gpu(0)), connected(gpu(0)))

    decision = agent_connected(state, inventory(gpu(0)), replaced_previous=True)

    assert decision == [(STREAM, connected(gpu(0), replaced_previous=True))]


def test_a_new_node_with_a_broken_gpu_says_why_it_is_unhealthy() -> None:
    broken = gpu(1, healthy=False, reason="Xid 79: fallen off the bus")

    decision = agent_connected(given(), inventory(gpu(0), broken), replaced_previous=False)

    assert decision[-1] == (
        STREAM,
        GpuMarkedUnhealthy(
            node_id=NODE, gpu_index=1, gpu_uuid="GPU-1", reason="Xid 79: fallen off the bus"
        ),
    )
    assert len(decision) == 3


def test_a_gpu_that_recovered_while_the_agent_was_away_is_recorded_on_hello() -> None:
    state = given(
        registered(gpu(0)),
        connected(gpu(0)),
        GpuMarkedUnhealthy(node_id=NODE, gpu_index=0, reason="ecc"),
    )

    decision = agent_connected(state, inventory(gpu(0)), replaced_previous=False)

    assert decision == [
        (STREAM, connected(gpu(0))),
        (STREAM, GpuRecovered(node_id=NODE, gpu_index=0, gpu_uuid="GPU-0")),
    ]


def test_a_hello_whose_gpus_are_as_the_log_knows_them_adds_no_gpu_events() -> None:
    state = given(
        registered(gpu(0)),
        GpuMarkedUnhealthy(node_id=NODE, gpu_index=0, reason="ecc"),
    )
    still_broken = gpu(0, healthy=False, reason="ecc")

    decision = agent_connected(state, inventory(still_broken), replaced_previous=False)

    assert decision == [(STREAM, connected(still_broken))]


def test_a_gpu_a_hello_no_longer_lists_is_not_kept_unhealthy() -> None:
    state = given(
        registered(gpu(0), gpu(1)),
        connected(gpu(0), gpu(1)),
        GpuMarkedUnhealthy(node_id=NODE, gpu_index=1, reason="Xid 79: fallen off the bus"),
    )

    decision = agent_connected(state, inventory(gpu(0)), replaced_previous=False)
    after = given(
        registered(gpu(0), gpu(1)),
        connected(gpu(0), gpu(1)),
        GpuMarkedUnhealthy(node_id=NODE, gpu_index=1, reason="Xid 79: fallen off the bus"),
        *(event for _, event in decision),
    )

    assert decision == [(STREAM, connected(gpu(0)))]
    assert after.nodes[NODE].gpus == (gpu(0),)


GONE_UNHEALTHY = (
    registered(gpu(0), gpu(1)),
    connected(gpu(0), gpu(1)),
    GpuMarkedUnhealthy(node_id=NODE, gpu_index=1, reason="Xid 79: fallen off the bus"),
    connected(gpu(0)),
)
"""A node whose GPU 1 was marked unhealthy, then left out of its agent's next hello."""


def test_a_gpu_back_in_a_hello_healthy_after_one_left_it_out_unhealthy_is_recovered() -> None:
    state = given(*GONE_UNHEALTHY)

    decision = agent_connected(state, inventory(gpu(0), gpu(1)), replaced_previous=False)

    assert decision == [
        (STREAM, connected(gpu(0), gpu(1))),
        (STREAM, GpuRecovered(node_id=NODE, gpu_index=1, gpu_uuid="GPU-1")),
    ]
    back = given(*GONE_UNHEALTHY, *(event for _, event in decision))
    assert back.nodes[NODE].gpus == (gpu(0), gpu(1))
    again = agent_connected(back, inventory(gpu(0), gpu(1)), replaced_previous=False)
    assert again == [(STREAM, connected(gpu(0), gpu(1)))], "recovered once"


def test_a_gpu_back_in_a_hello_with_the_fault_the_log_knows_is_not_marked_again() -> None:
    state = given(*GONE_UNHEALTHY)
    still = gpu(1, healthy=False, reason="Xid 79: fallen off the bus")
    other = gpu(1, healthy=False, reason="Xid 48: double-bit ECC")

    same = agent_connected(state, inventory(gpu(0), still), replaced_previous=False)
    new = agent_connected(state, inventory(gpu(0), other), replaced_previous=False)

    assert same == [(STREAM, connected(gpu(0), still))]
    assert new[1:] == [
        (
            STREAM,
            GpuMarkedUnhealthy(
                node_id=NODE, gpu_index=1, gpu_uuid="GPU-1", reason="Xid 48: double-bit ECC"
            ),
        )
    ]


def test_a_heartbeat_about_a_gpu_the_last_hello_left_out_is_still_ignored() -> None:
    state = given(*GONE_UNHEALTHY)

    healthy = GpuHealth(index=1, uuid="GPU-1", healthy=True)

    assert gpu_health_reported(state, NODE, [healthy]) == []


def test_an_agent_leaving_out_other_unhealthy_gpus_at_each_hello_cannot_grow_the_node() -> None:
    hellos = [connected(gpu(n, healthy=False, reason="lost")) for n in range(200)]

    state = given(registered(), *hellos, connected())

    kept = state.nodes[NODE].unlisted_gpus
    assert [g.index for g in kept] == list(range(136, 200)), "the latest 64 left out"


XID_79 = "Xid 79: fallen off the bus"
FAULTY = (
    registered(gpu(0), gpu(1)),
    connected(gpu(0), gpu(1)),
    GpuMarkedUnhealthy(node_id=NODE, gpu_index=1, gpu_uuid="GPU-1", reason=XID_79),
)
"""A node whose GPU 1 (UUID ``GPU-1``) the log knows unhealthy."""


def test_another_gpu_listed_healthy_under_a_faulty_gpu_s_index_is_not_its_recovery() -> None:
    """After a driver reload numbered the GPUs anew, the GPU now at index 1 is another one:
    the faulty GPU did not recover, and the newcomer is judged as a GPU the log never knew."""
    state = given(*FAULTY)
    newcomer = gpu(1, uuid="GPU-7")

    decision = agent_connected(state, inventory(gpu(0), newcomer), replaced_previous=False)

    assert decision == [(STREAM, connected(gpu(0), newcomer))]
    after = given(*FAULTY, *(event for _, event in decision))
    assert after.nodes[NODE].unlisted_gpus == (gpu(1, healthy=False, reason=XID_79),)


def test_another_gpu_with_the_faulty_gpu_s_fault_under_its_index_is_marked() -> None:
    state = given(*FAULTY)
    newcomer = gpu(1, uuid="GPU-7", healthy=False, reason=XID_79)

    decision = agent_connected(state, inventory(gpu(0), newcomer), replaced_previous=False)

    assert decision[1:] == [
        (
            STREAM,
            GpuMarkedUnhealthy(node_id=NODE, gpu_index=1, gpu_uuid="GPU-7", reason=XID_79),
        )
    ]


def test_the_faulty_gpu_back_healthy_under_another_index_is_recovered() -> None:
    state = given(*FAULTY)
    moved = gpu(2, uuid="GPU-1")

    decision = agent_connected(state, inventory(gpu(0), moved), replaced_previous=False)

    assert decision == [
        (STREAM, connected(gpu(0), moved)),
        (STREAM, GpuRecovered(node_id=NODE, gpu_index=2, gpu_uuid="GPU-1")),
    ]


def test_the_faulty_gpu_under_another_index_with_the_same_fault_records_nothing() -> None:
    state = given(*FAULTY)
    moved = gpu(2, uuid="GPU-1", healthy=False, reason=XID_79)
    newcomer = gpu(1, uuid="GPU-7")

    decision = agent_connected(state, inventory(gpu(0), newcomer, moved), replaced_previous=False)

    assert decision == [(STREAM, connected(gpu(0), newcomer, moved))]


def test_the_faulty_gpu_left_out_then_listed_under_another_index_is_judged_by_its_fault() -> None:
    """A hello listed another GPU under the faulty GPU's index; a later one lists the faulty
    GPU again, under another index: healthy it recovered, with its fault nothing is new."""
    newcomer = gpu(1, uuid="GPU-7")
    history = (*FAULTY, connected(gpu(0), newcomer))
    state = given(*history)
    healthy = gpu(2, uuid="GPU-1")
    still = gpu(2, uuid="GPU-1", healthy=False, reason=XID_79)

    back = agent_connected(state, inventory(gpu(0), newcomer, healthy), replaced_previous=False)
    same = agent_connected(state, inventory(gpu(0), newcomer, still), replaced_previous=False)

    assert back[1:] == [(STREAM, GpuRecovered(node_id=NODE, gpu_index=2, gpu_uuid="GPU-1"))]
    assert same == [(STREAM, connected(gpu(0), newcomer, still))]
    recovered = given(*history, *(event for _, event in back))
    assert recovered.nodes[NODE].unlisted_gpus == ()
    assert recovered.nodes[NODE].gpus == (gpu(0), newcomer, healthy)


def test_a_gpu_that_cannot_be_read_under_the_index_of_one_listed_elsewhere_is_news() -> None:
    """The faulty GPU answers under index 2 after a reload; the GPU under index 1 cannot be
    read, so it is listed without a UUID. It is not the faulty GPU, which is listed."""
    state = given(*FAULTY)
    unread = gpu(1, uuid="", healthy=False, reason=XID_79)
    moved = gpu(2, uuid="GPU-1")

    decision = agent_connected(state, inventory(gpu(0), unread, moved), replaced_previous=False)

    assert decision[1:] == [
        (STREAM, GpuMarkedUnhealthy(node_id=NODE, gpu_index=1, gpu_uuid="", reason=XID_79)),
        (STREAM, GpuRecovered(node_id=NODE, gpu_index=2, gpu_uuid="GPU-1")),
    ]


def test_a_gpu_without_a_uuid_is_known_by_its_index() -> None:
    state = given(*FAULTY)
    unread = gpu(1, uuid="", healthy=False, reason=XID_79)

    decision = agent_connected(state, inventory(gpu(0), unread), replaced_previous=False)

    assert decision == [(STREAM, connected(gpu(0), unread))]


# -- heartbeats carry GPU health changes -------------------------------------------------


def test_a_gpu_that_fails_is_marked_unhealthy_with_its_xid() -> None:
    state = given(registered(gpu(0)), connected(gpu(0)))
    failing = GpuHealth(index=0, uuid="GPU-0", healthy=False, reason="Xid 48", xid=48)

    decision = gpu_health_reported(state, NODE, [failing])

    assert decision == [
        (
            STREAM,
            GpuMarkedUnhealthy(
                node_id=NODE, gpu_index=0, gpu_uuid="GPU-0", reason="Xid 48", xid=48
            ),
        )
    ]


def test_a_failure_the_log_already_knows_is_not_recorded_twice() -> None:
    state = given(
        registered(gpu(0)),
        GpuMarkedUnhealthy(node_id=NODE, gpu_index=0, reason="Xid 48", xid=48),
    )
    again = GpuHealth(index=0, uuid="GPU-0", healthy=False, reason="Xid 48", xid=48)

    assert gpu_health_reported(state, NODE, [again]) == []


def test_a_gpu_that_comes_back_is_recovered() -> None:
    state = given(registered(gpu(0)), GpuMarkedUnhealthy(node_id=NODE, gpu_index=0, reason="x"))

    decision = gpu_health_reported(state, NODE, [GpuHealth(index=0, uuid="GPU-0", healthy=True)])

    assert decision == [(STREAM, GpuRecovered(node_id=NODE, gpu_index=0, gpu_uuid="GPU-0"))]


def test_a_gpu_that_fails_and_recovers_between_heartbeats_leaves_both_facts() -> None:
    state = given(registered(gpu(0)))
    changes = [
        GpuHealth(index=0, uuid="GPU-0", healthy=False, reason=None, xid=79),
        GpuHealth(index=0, uuid="GPU-0", healthy=True),
    ]

    decision = gpu_health_reported(state, NODE, changes)

    assert [type(event) for _, event in decision] == [GpuMarkedUnhealthy, GpuRecovered]
    first = decision[0][1]
    assert isinstance(first, GpuMarkedUnhealthy)
    assert first.reason == "reported unhealthy without a reason"


def test_health_of_another_gpu_than_the_node_s_under_that_index_is_ignored() -> None:
    state = given(*FAULTY)
    other = GpuHealth(index=1, uuid="GPU-7", healthy=True)

    assert gpu_health_reported(state, NODE, [other]) == []


def test_a_gpu_event_naming_another_gpu_than_the_node_s_under_its_index_changes_nothing() -> None:
    marked = GpuMarkedUnhealthy(node_id=NODE, gpu_index=0, gpu_uuid="GPU-7", reason="ecc")
    recovered = GpuRecovered(node_id=NODE, gpu_index=1, gpu_uuid="GPU-7")

    state = given(*FAULTY, marked, recovered)

    assert state.nodes[NODE].gpus == (gpu(0), gpu(1, healthy=False, reason=XID_79))


def test_health_of_a_gpu_or_node_the_log_does_not_know_is_ignored() -> None:
    change = GpuHealth(index=5, uuid="GPU-5", healthy=False, reason="x")

    assert gpu_health_reported(given(registered(gpu(0))), NODE, [change]) == []
    assert gpu_health_reported(given(), NODE, [change]) == []


# -- shard status ------------------------------------------------------------------------


def report(
    phase: ReportedPhase,
    *,
    pid: int | None = None,
    error: str | None = None,
    exit_code: int | None = None,
    log_tail: tuple[str, ...] = (),
) -> ShardPhaseReport:
    return ShardPhaseReport(
        replica_id="llama-1",
        shard_index=0,
        phase=phase,
        pid=pid,
        error=error,
        exit_code=exit_code,
        log_tail=log_tail,
    )


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (
            ShardPhase.STARTING,
            ShardStarting(replica_id="llama-1", shard_index=0, node_id=NODE, pid=4242),
        ),
        (ShardPhase.READY, ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE)),
        (
            ShardPhase.STOPPED,
            ShardStopped(replica_id="llama-1", shard_index=0, node_id=NODE, exit_code=0),
        ),
    ],
)
def test_a_placed_shard_moves_to_the_phase_its_agent_reports(
    phase: ReportedPhase, expected: AnyEvent
) -> None:
    state = given(registered(gpu(0)), PLACED)

    decision = shard_reported(state, NODE, report(phase, pid=4242, exit_code=0), port=PORT)

    assert decision == [("replica-llama-1", expected)]


def test_a_failed_shard_keeps_the_error_and_the_log_tail() -> None:
    state = given(
        registered(gpu(0)), PLACED, ShardStarting(replica_id="llama-1", shard_index=0, node_id=NODE)
    )
    failed = report(
        ShardPhase.FAILED,
        error="CUDA out of memory",
        exit_code=1,
        log_tail=("loading", "OutOfMemoryError"),
    )

    decision = shard_reported(state, NODE, failed, port=PORT)

    assert decision == [
        (
            "replica-llama-1",
            ShardFailed(
                replica_id="llama-1",
                shard_index=0,
                node_id=NODE,
                error="CUDA out of memory",
                exit_code=1,
                log_tail=("loading", "OutOfMemoryError"),
            ),
        )
    ]


def test_a_shard_stopped_before_it_was_ready_keeps_the_log_tail() -> None:
    state = given(
        registered(gpu(0)), PLACED, ShardStarting(replica_id="llama-1", shard_index=0, node_id=NODE)
    )
    stopped = report(ShardPhase.STOPPED, exit_code=0, log_tail=("loading weights",))

    [(_, event)] = shard_reported(state, NODE, stopped, port=PORT)

    assert isinstance(event, ShardStopped)
    assert event.log_tail == ("loading weights",)


def test_a_stop_its_agent_made_on_purpose_is_recorded_with_the_agent_s_reason() -> None:
    state = given(
        registered(gpu(0)), PLACED, ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE)
    )
    stopped = ShardPhaseReport(
        replica_id="llama-1", shard_index=0, phase=ShardPhase.STOPPED, reason="agent shutting down"
    )

    [(_, event)] = shard_reported(state, NODE, stopped, port=PORT)

    assert isinstance(event, ShardStopped)
    assert event.reason == "agent shutting down"


def test_a_failure_without_an_error_is_explained_by_its_exit_code() -> None:
    state = given(PLACED)

    [(_, event)] = shard_reported(state, NODE, report(ShardPhase.FAILED, exit_code=137), port=PORT)

    assert isinstance(event, ShardFailed)
    assert event.error == "exited with code 137"


def test_a_failure_for_another_reason_records_no_port_flag() -> None:
    """Stored as failures were before the flag existed, not with ``false`` written out."""
    state = given(PLACED)

    [(_, event)] = shard_reported(state, NODE, report(ShardPhase.FAILED, exit_code=1), port=PORT)

    assert isinstance(event, ShardFailed)
    assert b"port_held_elsewhere" not in msgspec.json.encode(event)


def test_a_failure_on_a_port_another_process_holds_is_recorded_as_such() -> None:
    state = given(connected(gpu(0)), PLACED)
    held = ShardPhaseReport(
        replica_id="llama-1",
        shard_index=0,
        phase=ShardPhase.FAILED,
        error=f"port {PORT} is held by pid 4242, not our engine (pid 4242: nc)",
        port_held_elsewhere=True,
    )

    [(_, event)] = shard_reported(state, NODE, held, port=PORT)

    assert isinstance(event, ShardFailed)
    assert event.port_held_elsewhere
    after = given(connected(gpu(0)), PLACED, event)
    assert after.nodes[NODE].ports_held_elsewhere == (PORT,)


def test_a_repeated_phase_is_not_recorded_again() -> None:
    state = given(PLACED, ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE))

    assert shard_reported(state, NODE, report(ShardPhase.READY), port=PORT) == []


TIMED_OUT = (
    PLACED,
    ReplicaStartupTimedOut(replica_id="llama-1", timeout_s=120, waited_s=121),
)
"""llama-1 timed out before its agent said its engine was starting: the engine's stop is on
the way."""


@pytest.mark.parametrize("phase", [ShardPhase.STARTING, ShardPhase.READY])
def test_a_shard_of_an_ended_replica_that_runs_again_records_nothing(
    phase: ReportedPhase,
) -> None:
    state = given(registered(gpu(0)), *TIMED_OUT)

    assert shard_reported(state, NODE, report(phase, pid=4343), port=PORT) == []


def test_the_end_of_an_ended_replica_s_engine_is_recorded_once() -> None:
    state = given(registered(gpu(0)), *TIMED_OUT)
    stopped = report(ShardPhase.STOPPED, exit_code=0, log_tail=("loading weights",))

    [(_, event)] = shard_reported(state, NODE, stopped, port=PORT)
    ended = given(registered(gpu(0)), *TIMED_OUT, event)

    assert isinstance(event, ShardStopped)
    assert ended.replicas["llama-1"].shards[0].log_tail == ("loading weights",)
    for again in (stopped, report(ShardPhase.FAILED, exit_code=1)):
        assert shard_reported(ended, NODE, again, port=PORT) == []


@pytest.mark.parametrize(
    ("node_id", "replica_id", "shard_index"),
    [(NODE, "llama-9", 0), (NODE, "llama-1", 1), ("gpu-2", "llama-1", 0)],
    ids=["unknown replica", "unknown shard", "shard placed on another node"],
)
def test_a_shard_the_log_does_not_place_on_that_node_is_left_to_the_reconciler(
    node_id: str, replica_id: str, shard_index: int
) -> None:
    stray = ShardPhaseReport(replica_id=replica_id, shard_index=shard_index, phase=ShardPhase.READY)

    assert shard_reported(given(PLACED), node_id, stray, port=PORT) == []


@pytest.mark.parametrize("phase", [ShardPhase.STARTING, ShardPhase.READY])
def test_a_shard_running_at_another_port_than_placed_is_left_to_the_reconciler(
    phase: ReportedPhase,
) -> None:
    """Before, a ``ready`` at port 20002 for the shard placed at 20001 was recorded: the log
    had the placed copy up, the gateway routed to 20001, where nothing answers, and the
    next adoption stopped the engine that really runs, at 20002, as a second copy. Now the
    log's copy changes only on news of itself; adoption judges the other engine."""
    state = given(registered(gpu(0)), PLACED)
    elsewhere = ShardStatusReport(node_id=NODE, phase=report(phase, pid=4242), port=PORT + 1)

    assert decide(state, elsewhere) == []


@pytest.mark.parametrize("phase", [ShardPhase.FAILED, ShardPhase.STOPPED])
def test_a_shard_that_ends_at_another_port_than_placed_is_recorded(phase: ReportedPhase) -> None:
    """An agent runs one engine per shard, so an engine of this shard that ends elsewhere
    says that none runs at the placed port either."""
    ready = ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE)
    state = given(registered(gpu(0)), PLACED, ready)
    elsewhere = ShardStatusReport(node_id=NODE, phase=report(phase, exit_code=1), port=PORT + 1)

    [(stream, event)] = decide(state, elsewhere)

    assert stream == "replica-llama-1"
    assert isinstance(event, ShardFailed | ShardStopped)


@pytest.mark.parametrize("phase", [ShardPhase.FAILED, ShardPhase.STOPPED])
def test_the_end_of_an_engine_stopped_as_a_stray_leaves_the_log_s_copy_alone(
    phase: ReportedPhase,
) -> None:
    """The log's copy came up at the placed port; the node also ran the shard at another
    port, which adoption stopped as a second copy ("two engines run"). Before, the stray's
    ``stopped`` was recorded against the log's copy, and its replica then failed "stopped
    without being asked to" for a stop adoption asked for."""
    ready = ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE)
    stray = StrayStopped(
        node_id=NODE,
        replica_id="llama-1",
        shard_index=0,
        model="llama",
        port=PORT + 1,
        pid=999,
        rule="the log's copy came up on gpu-1 port 20001; two engines run",
    )
    state = given(registered(gpu(0)), PLACED, ready, stray)
    ended = ShardStatusReport(
        node_id=NODE,
        phase=report(phase, pid=999, exit_code=0),
        port=PORT + 1,
        command_id="stray-llama-1-0-999",
    )

    assert decide(state, ended) == []


def test_an_engine_ending_at_the_placed_port_is_the_log_s_copy_even_with_its_pid_a_stray_s() -> (
    None
):
    """Only an end at another port than the log's can be a stray's: the node cannot keep
    its own copy's end out of the log by naming a stray's pid."""
    ready = ShardReady(replica_id="llama-1", shard_index=0, node_id=NODE)
    stray = StrayStopped(
        node_id=NODE,
        replica_id="llama-1",
        shard_index=0,
        model="llama",
        port=PORT + 1,
        pid=999,
        rule="the log's copy came up on gpu-1 port 20001; two engines run",
    )
    state = given(registered(gpu(0)), PLACED, ready, stray)
    ended = ShardStatusReport(
        node_id=NODE, phase=report(ShardPhase.STOPPED, pid=999, exit_code=0), port=PORT
    )

    [(_, event)] = decide(state, ended)

    assert isinstance(event, ShardStopped)


# -- identity and disconnects ------------------------------------------------------------


def test_an_identity_mismatch_is_recorded_on_the_claimed_nodes_stream() -> None:
    claim = IdentityClaim(
        claimed_node_id="gpu-9",
        certificate_subject="O=llmgw,OU=node,CN=gpu-1",
        remote_address="127.0.0.8:40000",
        reason="certificate common name 'gpu-1' does not match node id 'gpu-9'",
    )

    assert identity_rejected(claim) == [
        (
            "node-gpu-9",
            IdentityRejected(
                claimed_node_id="gpu-9",
                certificate_subject="O=llmgw,OU=node,CN=gpu-1",
                remote_address="127.0.0.8:40000",
                reason="certificate common name 'gpu-1' does not match node id 'gpu-9'",
            ),
        )
    ]


def test_an_agent_that_goes_away_disconnects_its_node() -> None:
    state = given(registered(gpu(0)), connected(gpu(0)))

    assert agent_gone(state, NODE, "no heartbeat for 15.5s") == [
        (STREAM, NodeDisconnected(node_id=NODE, reason="no heartbeat for 15.5s"))
    ]


def test_a_node_that_is_not_connected_is_not_disconnected_again() -> None:
    state = given(registered(gpu(0)), connected(gpu(0)), NodeDisconnected(node_id=NODE, reason="x"))

    assert agent_gone(state, NODE, "late close") == []
    assert agent_gone(given(), NODE, "never seen") == []
