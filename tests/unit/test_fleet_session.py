"""Stories of one agent connection, told from the control plane's side."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from app.domain.egress import EngineNetworks
from app.domain.reports import FleetView, observe
from app.hub.budget import MessageBudget
from app.hub.edge import report_of
from app.hub.session import (
    CERTIFICATE_EXPIRED,
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    AgentSession,
    Close,
    CommandCompleted,
    ConnectionRefused,
    IdentityMismatch,
    Observe,
    PeerCertificate,
    Send,
    SessionState,
    ShardStatusReported,
)
from app.hub.shard_lives import MAX_SHARDS_STARTED_BEFORE
from wire.errors import SessionStateError
from wire.messages import (
    MAX_CLOSE_REASON_BYTES,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    CloseCode,
    CommandResult,
    GpuHealthChange,
    GpuMemoryReading,
    GpuReport,
    Heartbeat,
    HeartbeatAck,
    HeartbeatShard,
    Hello,
    ShardState,
    ShardStatus,
    StartShard,
    StopShard,
    Welcome,
    encode,
)

INTERVAL_S = 5.0
TIMEOUT_S = 15.0
REMOTE = "127.0.0.7:51234"
NODE_CERT = PeerCertificate(common_name="gpu-1", subject="CN=gpu-1,O=llmgw", kind="node")


GPU_0 = {
    "index": 0,
    "uuid": "GPU-0",
    "name": "H100",
    "memory_total_mib": 81559,
    "memory_used_mib": 0,
    "healthy": True,
}


def new_session(
    *,
    peer: PeerCertificate | None = NODE_CERT,
    require_identity: bool = True,
    now: float = 0.0,
    engine_networks: EngineNetworks | None = None,
    certificate_expires_at: float | None = None,
) -> AgentSession:
    return AgentSession(
        peer=peer,
        remote_address=REMOTE,
        require_identity=require_identity,
        heartbeat_interval_s=INTERVAL_S,
        heartbeat_timeout_s=TIMEOUT_S,
        server_id="cp-a",
        epoch=3,
        now=now,
        engine_networks=engine_networks,
        certificate_expires_at=certificate_expires_at,
    )


def hello(node_id: str = "gpu-1", protocol_version: int = PROTOCOL_VERSION) -> Hello:
    return Hello(
        protocol_version=protocol_version,
        node_id=node_id,
        agent_version="0.1.0",
        address="127.0.0.7",
        port_range=(20000, 20999),
    )


def connected(now: float = 0.0) -> AgentSession:
    session = new_session(now=now)
    session.receive(encode(hello()), now)
    assert session.state is SessionState.ACTIVE
    return session


START = StartShard(
    command_id="c-1",
    replica_id="llama-1",
    shard_index=0,
    model="llama",
    argv=("vllm", "serve"),
    gpus=(0,),
    port=20001,
)


def gone(reason: str) -> Observe:
    return Observe(AgentGone(node_id="gpu-1", reason=reason))


# -- handshake ----------------------------------------------------------------------------


def test_a_node_that_says_hello_is_welcomed_and_reported() -> None:
    session = new_session()

    outputs = session.receive(encode(hello()), now=1.0)

    assert outputs == [
        Send(Welcome(protocol_version=1, heartbeat_interval_s=5.0, server_id="cp-a", epoch=3)),
        Observe(AgentHello(node_id="gpu-1", hello=hello(), remote_address=REMOTE)),
    ]
    assert session.state is SessionState.ACTIVE
    assert session.node_id == "gpu-1"


def test_hello_as_text_is_accepted_like_bytes() -> None:
    session = new_session()
    outputs = session.receive(encode(hello()).decode(), now=1.0)
    assert session.state is SessionState.ACTIVE
    assert isinstance(outputs[0], Send)


def test_a_certificate_for_another_node_is_refused_and_recorded() -> None:
    session = new_session(
        peer=PeerCertificate(common_name="gpu-2", subject="CN=gpu-2", kind="node")
    )

    outputs = session.receive(encode(hello("gpu-1")), now=1.0)

    reason = "certificate common name 'gpu-2' does not match node id 'gpu-1'"
    assert outputs == [
        Close(CloseCode.POLICY_VIOLATION, reason),
        Observe(
            IdentityMismatch(
                claimed_node_id="gpu-1",
                certificate_subject="CN=gpu-2",
                remote_address=REMOTE,
                reason=reason,
            )
        ),
    ]
    assert session.state is SessionState.CLOSED
    assert session.node_id is None


def test_an_operator_certificate_cannot_connect_as_a_node() -> None:
    operator = PeerCertificate(
        common_name="gpu-1", subject="CN=gpu-1,OU=operators", kind="operator"
    )
    session = new_session(peer=operator)

    outputs = session.receive(encode(hello("gpu-1")), now=1.0)

    reason = "a certificate of kind 'operator' cannot connect as a node"
    assert outputs[0] == Close(CloseCode.POLICY_VIOLATION, reason)
    assert outputs[1] == Observe(
        IdentityMismatch(
            claimed_node_id="gpu-1",
            certificate_subject="CN=gpu-1,OU=operators",
            remote_address=REMOTE,
            reason=reason,
        )
    )


def test_a_connection_without_a_certificate_is_refused_when_identity_is_required() -> None:
    outputs = new_session(peer=None).receive(encode(hello()), now=1.0)
    assert outputs[0] == Close(CloseCode.POLICY_VIOLATION, "no client certificate")
    assert isinstance(outputs[1], Observe)
    assert isinstance(outputs[1].observation, IdentityMismatch)


def test_identity_is_not_checked_when_not_required() -> None:
    stranger = PeerCertificate(common_name="laptop", subject="CN=laptop", kind="operator")
    session = new_session(peer=stranger, require_identity=False)
    session.receive(encode(hello("gpu-1")), now=1.0)
    assert session.state is SessionState.ACTIVE


def test_a_hello_in_another_protocol_version_is_refused_naming_both() -> None:
    session = new_session()

    outputs = session.receive(encode(hello(protocol_version=2)), now=1.0)

    assert outputs == [
        Close(
            CloseCode.PROTOCOL_ERROR,
            "protocol version 2 is not supported; this side speaks version 1",
        )
    ]
    assert session.state is SessionState.CLOSED


def test_a_message_before_hello_is_refused() -> None:
    session = new_session()
    outputs = session.receive(encode(Heartbeat(seq=0)), now=1.0)
    assert outputs == [Close(CloseCode.PROTOCOL_ERROR, "expected hello, got heartbeat")]
    assert session.state is SessionState.CLOSED


def test_hello_twice_closes_and_the_agent_is_gone() -> None:
    session = connected()
    outputs = session.receive(encode(hello()), now=2.0)
    assert outputs == [Close(CloseCode.PROTOCOL_ERROR, "hello twice"), gone("hello twice")]


# -- bad input ----------------------------------------------------------------------------

BAD_INPUTS = [
    pytest.param(b"\x00\xff\x13garbage", CloseCode.PROTOCOL_ERROR, "not valid JSON", id="garbage"),
    pytest.param(b'{"type": "hello",', CloseCode.PROTOCOL_ERROR, "not valid JSON", id="bad-json"),
    pytest.param(
        b'{"type": "gossip"}',
        CloseCode.PROTOCOL_ERROR,
        "unknown message type 'gossip'",
        id="unknown-type",
    ),
    pytest.param(
        encode(START),
        CloseCode.PROTOCOL_ERROR,
        "'start_shard' is not a message the control plane receives",
        id="server-message",
    ),
    pytest.param(
        b'{"type": "heartbeat", "seq": -1}',
        CloseCode.PROTOCOL_ERROR,
        "malformed heartbeat: Expected `int` >= 0 - at `$.seq`",
        id="malformed",
    ),
    pytest.param(
        b" " * (MAX_MESSAGE_BYTES + 1),
        CloseCode.MESSAGE_TOO_BIG,
        f"message of {MAX_MESSAGE_BYTES + 1} bytes is over the {MAX_MESSAGE_BYTES}-byte limit",
        id="oversized",
    ),
]


@pytest.mark.parametrize(("data", "code", "reason"), BAD_INPUTS)
def test_bad_input_before_hello_closes_with_a_reason(
    data: bytes, code: CloseCode, reason: str
) -> None:
    session = new_session()
    outputs = session.receive(data, now=1.0)
    assert len(outputs) == 1
    assert isinstance(outputs[0], Close)
    assert outputs[0].code == code
    assert reason in outputs[0].reason
    assert session.state is SessionState.CLOSED


@pytest.mark.parametrize(("data", "code", "reason"), BAD_INPUTS)
def test_bad_input_after_hello_closes_and_the_agent_is_gone(
    data: bytes, code: CloseCode, reason: str
) -> None:
    session = connected()
    close, observed = session.receive(data, now=1.0)
    assert isinstance(close, Close)
    assert (close.code, reason in close.reason) == (code, True)
    assert isinstance(observed, Observe)
    assert isinstance(observed.observation, AgentGone)
    assert reason in observed.observation.reason


@given(st.binary(max_size=300) | st.text(max_size=300))
def test_whatever_arrives_any_close_reason_fits_a_close_frame(data: bytes | str) -> None:
    for session in (new_session(), connected()):
        for output in session.receive(data, now=1.0):
            if isinstance(output, Close):
                assert len(output.reason.encode()) <= MAX_CLOSE_REASON_BYTES


def test_a_closed_session_ignores_everything() -> None:
    session = connected()
    session.receive(b"nonsense", now=1.0)

    assert session.receive(encode(Heartbeat(seq=1)), now=2.0) == []
    assert session.tick(now=1000.0) == []
    assert session.connection_lost("eof", now=1001.0) == []
    with pytest.raises(SessionStateError):
        session.send_command(START)


# -- traffic ------------------------------------------------------------------------------


def test_heartbeats_are_observed_and_acknowledged() -> None:
    session = connected()
    beat = Heartbeat(
        seq=7, shards=(HeartbeatShard(replica_id="m-1", shard_index=0, state="ready"),)
    )

    outputs = session.receive(encode(beat), now=5.0)

    assert outputs == [
        Observe(AgentHeartbeat(node_id="gpu-1", heartbeat=beat)),
        Send(HeartbeatAck(seq=7)),
    ]


def test_only_health_changes_of_gpus_the_hello_listed_go_on_and_others_are_said_once() -> None:
    session = new_session()
    listed = replace(
        hello(), gpus=(GpuReport(**GPU_0), GpuReport(**{**GPU_0, "index": 1, "uuid": "GPU-1"}))
    )
    session.receive(encode(listed), 0.0)
    true = GpuHealthChange(index=0, uuid="GPU-0", healthy=False, reason="Xid 79")
    invented = GpuHealthChange(index=5, uuid="GPU-5", healthy=False)
    foreign = GpuHealthChange(index=1, uuid="GPU-9", healthy=False)

    first = session.receive(encode(Heartbeat(seq=0, gpu_changes=(invented, true, foreign))), 1.0)
    again = session.receive(encode(Heartbeat(seq=1, gpu_changes=(invented,))), 2.0)

    assert first[0] == Observe(
        AgentHeartbeat(
            node_id="gpu-1",
            heartbeat=Heartbeat(seq=0, gpu_changes=(true,)),
            ignored_gpus=("1 (GPU-9)", "5 (GPU-5)"),
        )
    )
    assert again[0] == Observe(AgentHeartbeat(node_id="gpu-1", heartbeat=Heartbeat(seq=1)))
    assert [o for o in first + again if isinstance(o, Send)] == [
        Send(HeartbeatAck(seq=0)),
        Send(HeartbeatAck(seq=1)),
    ]
    assert session.state is SessionState.ACTIVE


def test_memory_readings_of_gpus_the_hello_listed_go_on_into_the_live_view() -> None:
    session = new_session()
    session.receive(encode(replace(hello(), gpus=(GpuReport(**GPU_0),))), 0.0)
    taken = GpuMemoryReading(index=0, uuid="GPU-0", used_mib=70_000)
    invented = GpuMemoryReading(index=5, uuid="GPU-5", used_mib=1_000)
    foreign = GpuMemoryReading(index=0, uuid="GPU-9", used_mib=1_000)

    outputs = session.receive(encode(Heartbeat(seq=0, gpu_memory=(invented, taken, foreign))), 1.0)

    beat = Heartbeat(seq=0, gpu_memory=(taken,))
    assert outputs == [
        Observe(AgentHeartbeat(node_id="gpu-1", heartbeat=beat)),
        Send(HeartbeatAck(seq=0)),
    ]
    report = report_of(AgentHeartbeat(node_id="gpu-1", heartbeat=beat))
    view = observe(
        observe(FleetView(), report_of(hello_observed()), lambda _: None), report, lambda _: None
    )
    assert view.reports["gpu-1"].gpu_memory_used_mib == {0: 70_000}


def hello_observed() -> AgentHello:
    return AgentHello(node_id="gpu-1", hello=hello(), remote_address=REMOTE)


@pytest.mark.parametrize(
    ("readings", "reason"),
    [
        (
            (GpuMemoryReading(index=0, uuid="GPU-0", used_mib=81_560),),
            "GPU 0 reports 81560 MiB used of 81559 MiB",
        ),
        (
            (
                GpuMemoryReading(index=0, uuid="GPU-0", used_mib=1),
                GpuMemoryReading(index=0, uuid="GPU-0", used_mib=2),
            ),
            "a heartbeat reads GPU 0's memory twice",
        ),
    ],
)
def test_a_memory_reading_no_gpu_can_have_is_refused_as_such_a_hello_is(
    readings: tuple[GpuMemoryReading, ...], reason: str
) -> None:
    session = new_session()
    session.receive(encode(replace(hello(), gpus=(GpuReport(**GPU_0),))), 0.0)

    outputs = session.receive(encode(Heartbeat(seq=0, gpu_memory=readings)), 1.0)

    assert outputs == [
        Close(CloseCode.PROTOCOL_ERROR, reason),
        gone(reason),
        refused(reason),
    ]
    assert session.state is SessionState.CLOSED


def test_shard_status_and_command_results_are_observed() -> None:
    session = connected()
    session.send_command(replace(START, replica_id="m-1"))  # c-1, the status's cause
    status = ShardStatus(
        replica_id="m-1",
        shard_index=0,
        state="failed",
        port=20001,
        error="exited",
        exit_code=1,
        log_tail=("CUDA out of memory",),
        command_id="c-1",
    )
    result = CommandResult(command_id="c-1", ok=False, error="exited")

    assert session.receive(encode(status), now=1.0) == [
        Observe(ShardStatusReported(node_id="gpu-1", status=status))
    ]
    assert session.receive(encode(result), now=2.0) == [
        Observe(CommandCompleted(node_id="gpu-1", result=result, sent=True))
    ]


def shard_at(state: ShardState) -> ShardStatus:
    return ShardStatus(replica_id="llama-1", shard_index=0, state=state, port=20001)


def test_a_shard_flipped_between_phases_closes_the_connection_naming_it() -> None:
    """Before, every status went on, and each flip of a placed shard wrote an event. Now a
    step back no start explains closes the connection (1002), and nothing of it goes on."""
    session = connected()
    flips: list[ShardState] = ["starting", "ready"]
    for now, state in enumerate(flips):
        outputs = session.receive(encode(shard_at(state)), now=float(now))
        assert outputs == [Observe(ShardStatusReported(node_id="gpu-1", status=shard_at(state)))]

    assert session.receive(encode(shard_at("starting")), now=3.0) == [
        Close(
            CloseCode.PROTOCOL_ERROR,
            "ready -> starting for shard llama-1/0: no start_shard explains it",
        ),
        Observe(
            AgentGone(
                node_id="gpu-1",
                reason="ready -> starting for shard llama-1/0: no start_shard explains it",
            )
        ),
    ]
    assert session.state is SessionState.CLOSED


def test_a_start_sent_on_the_connection_explains_a_new_launch_of_its_shard() -> None:
    session = connected()
    first: list[ShardState] = ["starting", "ready", "stopped"]
    for state in first:  # a launch whose start may have come before the connection
        outputs = session.receive(encode(shard_at(state)), now=1.0)
        assert outputs == [Observe(ShardStatusReported(node_id="gpu-1", status=shard_at(state)))]
    session.send_command(START)
    second: list[ShardState] = ["starting", "ready"]
    for state in second:
        outputs = session.receive(encode(shard_at(state)), now=2.0)
        assert outputs == [Observe(ShardStatusReported(node_id="gpu-1", status=shard_at(state)))]
    assert session.receive(encode(shard_at("starting")), now=3.0)[0] == Close(
        CloseCode.PROTOCOL_ERROR,
        "ready -> starting for shard llama-1/0: no start_shard explains it",
    )


def test_a_node_naming_made_up_shards_is_closed_before_the_live_view_outgrows_it() -> None:
    """Before, each new made-up shard id was a launch a start before the connection might
    explain, so every one was taken and the live view grew by a shard a status for as long
    as the connection lasted (about 1.4 ms a status once it held 100,000). Now the shards a
    connection may speak of are its hello's, those started on it and an allowance: the one
    past it closes the connection (1002, naming the limit) and reaches nothing."""
    session = connected()
    view = observe(
        FleetView(),
        report_of(AgentHello(node_id="gpu-1", hello=hello(), remote_address=REMOTE)),
        lambda _: None,
    )
    largest, closes = 0, []
    for index in range(MAX_SHARDS_STARTED_BEFORE + 100):
        status = ShardStatus(
            replica_id=f"made-up-{index}", shard_index=0, state="ready", port=20001
        )
        # 40 a second: within the connection's message budget.
        for output in session.receive(encode(status), now=index / 40):
            if isinstance(output, Observe):
                view = observe(view, report_of(output.observation), lambda _: None)
            elif isinstance(output, Close):
                closes.append(output)
        node = view.reports.get("gpu-1")
        largest = max(largest, len(node.shards) if node else 0)

    assert largest == MAX_SHARDS_STARTED_BEFORE
    assert closes == [
        Close(
            CloseCode.PROTOCOL_ERROR,
            f"more than {MAX_SHARDS_STARTED_BEFORE} shards neither in the hello nor started "
            f"on this connection: made-up-{MAX_SHARDS_STARTED_BEFORE}/0",
        )
    ]
    assert "gpu-1" not in view.reports  # the node is gone with its connection


def test_commands_go_out_only_once_the_agent_said_hello() -> None:
    session = new_session()
    with pytest.raises(SessionStateError, match="AWAITING_HELLO"):
        session.send_command(START)

    session.receive(encode(hello()), now=1.0)
    stop = StopShard(command_id="c-2", replica_id="llama-1", shard_index=0, grace_s=30.0)

    assert session.send_command(START) == [Send(START)]
    assert session.send_command(stop) == [Send(stop)]


# -- time ---------------------------------------------------------------------------------


def test_an_agent_silent_past_the_timeout_is_closed_and_gone() -> None:
    session = connected(now=0.0)

    assert session.tick(now=TIMEOUT_S) == []
    outputs = session.tick(now=TIMEOUT_S + 0.5)

    assert outputs == [
        Close(CloseCode.TIMED_OUT, "no heartbeat for 15.5s"),
        gone("no heartbeat for 15.5s"),
    ]
    assert session.state is SessionState.CLOSED


def test_every_message_keeps_the_connection_alive() -> None:
    session = connected(now=0.0)
    for second in range(5, 60, 5):
        session.receive(encode(Heartbeat(seq=second)), now=float(second))
        assert session.tick(now=second + TIMEOUT_S - 0.1) == []
    assert session.state is SessionState.ACTIVE


def test_a_connection_that_never_says_hello_is_closed_quietly() -> None:
    session = new_session(now=100.0)
    assert session.tick(now=100.0 + TIMEOUT_S) == []
    assert session.tick(now=100.0 + TIMEOUT_S + 0.1) == [
        Close(CloseCode.TIMED_OUT, "no hello within 15s")
    ]


# -- the end of a connection --------------------------------------------------------------


def test_a_lost_connection_reports_the_agent_gone_once() -> None:
    session = connected()
    assert session.connection_lost("connection reset", now=3.0) == [gone("connection reset")]
    assert session.connection_lost("connection reset", now=4.0) == []


def test_a_connection_lost_before_hello_reports_nothing() -> None:
    assert new_session().connection_lost("eof", now=1.0) == []


def test_an_agent_closed_for_silence_is_not_reported_gone_again_when_the_socket_ends() -> None:
    session = connected()
    session.tick(now=TIMEOUT_S + 1)
    assert session.connection_lost("closed", now=TIMEOUT_S + 2) == []


def test_a_replaced_connection_closes_without_reporting_the_node_gone() -> None:
    session = connected()
    assert session.replaced() == [Close(CloseCode.REPLACED, "replaced by a newer connection")]
    assert session.connection_lost("closed by server", now=2.0) == []
    assert session.replaced() == []


def test_a_hello_refused_for_a_live_connection_elsewhere_closes_without_the_node_gone() -> None:
    session = connected()
    node_id = session.node_id

    assert session.connected_elsewhere("127.0.0.9:4000") == [
        Close(
            CloseCode.CONNECTED_ELSEWHERE,
            f"two agents run with node {node_id}'s certificate; stop one "
            "(connected from 127.0.0.9:4000, which answers)",
        )
    ]
    assert session.state is SessionState.CLOSED
    assert session.connection_lost("closed by server", now=2.0) == []
    assert session.connected_elsewhere("127.0.0.9:4000") == []


def test_an_agent_that_reads_nothing_is_closed_and_gone_once() -> None:
    session = connected()
    reason = "a message waited 2s to be sent: the agent reads nothing"

    assert session.not_reading(2.0) == [Close(CloseCode.TIMED_OUT, reason), gone(reason)]
    assert session.state is SessionState.CLOSED
    assert session.not_reading(2.0) == []
    assert session.connection_lost("aborted", now=3.0) == []


def test_the_timeout_must_leave_room_for_a_heartbeat() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        AgentSession(
            peer=NODE_CERT,
            remote_address=REMOTE,
            require_identity=True,
            heartbeat_interval_s=10.0,
            heartbeat_timeout_s=10.0,
            server_id="cp-a",
            epoch=1,
            now=0.0,
        )


def test_the_welcome_on_the_wire_is_plain_json() -> None:
    send = new_session().receive(encode(hello()), now=0.0)[0]
    assert isinstance(send, Send)
    assert json.loads(encode(send.message)) == {
        "type": "welcome",
        "protocol_version": 1,
        "heartbeat_interval_s": 5.0,
        "server_id": "cp-a",
        "epoch": 3,
    }


# -- what a hello may claim, and the budget ------------------------------------------------


def refused(reason: str, *, over_budget: bool = False) -> Observe:
    refusal = ConnectionRefused(
        node_id="gpu-1",
        remote_address=REMOTE,
        certificate_serial="",
        reason=reason,
        over_budget=over_budget,
    )
    return Observe(refusal)


def test_a_hello_advertising_an_address_nobody_vouched_for_is_refused_and_reported() -> None:
    session = new_session()

    outputs = session.receive(encode(replace(hello(), address="169.254.169.254")), now=1.0)

    [close, observe] = outputs
    assert isinstance(close, Close)
    assert close.code is CloseCode.POLICY_VIOLATION
    assert isinstance(observe, Observe)
    assert isinstance(observe.observation, ConnectionRefused)
    assert observe.observation.reason.startswith("advertised address '169.254.169.254'")
    assert session.state is SessionState.CLOSED
    assert session.node_id is None  # never accepted: nothing to report gone later


def test_an_address_the_certificate_names_is_accepted_though_the_connection_differs() -> None:
    peer = replace(NODE_CERT, ip_addresses=("10.20.0.7",), dns_names=("gpu-1.internal",))
    networks = EngineNetworks.parse("10.20.0.0/16,gpu-1.internal")
    for address in ("10.20.0.7", "gpu-1.internal"):
        session = new_session(peer=peer, engine_networks=networks)
        session.receive(encode(replace(hello(), address=address)), now=1.0)
        assert session.state is SessionState.ACTIVE


def test_an_impossible_inventory_is_a_protocol_error_with_its_reason() -> None:
    session = new_session()
    twice = GpuReport(
        index=0, uuid="GPU-0", name="H100", memory_total_mib=1, memory_used_mib=0, healthy=True
    )

    outputs = session.receive(encode(replace(hello(), gpus=(twice, twice))), now=1.0)

    assert outputs == [
        Close(CloseCode.PROTOCOL_ERROR, "the hello lists GPU index 0 twice"),
        refused("the hello lists GPU index 0 twice"),
    ]


def test_a_connection_over_its_budget_is_closed_reported_gone_and_refused_once() -> None:
    session = AgentSession(
        peer=NODE_CERT,
        remote_address=REMOTE,
        require_identity=True,
        heartbeat_interval_s=INTERVAL_S,
        heartbeat_timeout_s=TIMEOUT_S,
        server_id="cp-a",
        epoch=3,
        now=0.0,
        budget=MessageBudget(messages_per_s=1, message_burst=3),
    )
    session.receive(encode(hello()), 0.0)
    session.receive(encode(Heartbeat(seq=1)), 0.0)
    session.receive(encode(Heartbeat(seq=2)), 0.0)

    outputs = session.receive(encode(Heartbeat(seq=3)), 0.0)

    reason = "over the message budget: more than 1 messages a second (bursts of 3)"
    assert outputs == [
        Close(CloseCode.POLICY_VIOLATION, reason),
        gone(reason),
        refused(reason, over_budget=True),
    ]
    assert session.receive(encode(Heartbeat(seq=4)), 0.0) == []


def test_a_revoked_connection_is_closed_and_its_node_reported_gone() -> None:
    session = connected()

    outputs = session.revoked("certificate 1f was revoked")

    assert outputs == [
        Close(CloseCode.POLICY_VIOLATION, "certificate 1f was revoked"),
        gone("certificate 1f was revoked"),
    ]
    assert session.revoked("again") == []


def test_a_connection_is_closed_once_its_certificate_expires_however_busy() -> None:
    """The handshake checked the certificate's dates when the agent connected; a connection
    outliving them is closed at the next message or tick, and its node is gone."""
    session = new_session(certificate_expires_at=100.0)
    session.receive(encode(hello()), 0.0)
    for second in range(5, 100, 5):
        session.receive(encode(Heartbeat(seq=second)), float(second))
    assert session.tick(99.9) == []
    assert session.state is SessionState.ACTIVE

    outputs = session.receive(encode(Heartbeat(seq=100)), 100.0)

    assert outputs == [
        Close(CloseCode.POLICY_VIOLATION, CERTIFICATE_EXPIRED),
        gone(CERTIFICATE_EXPIRED),
    ]
    assert session.tick(101.0) == []


def test_a_quiet_connection_is_closed_at_its_certificate_expiry_too() -> None:
    session = new_session(certificate_expires_at=3.0)
    assert session.tick(2.9) == []
    assert session.tick(3.0) == [Close(CloseCode.POLICY_VIOLATION, CERTIFICATE_EXPIRED)]
