"""Stories of one connection to the control plane, told from the agent's side."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from agent.session import (
    Close,
    CommandLedger,
    Execute,
    HeartbeatContent,
    Send,
    ServerSession,
    SessionState,
)
from app.domain import model_spec
from wire.errors import SessionStateError
from wire.messages import (
    MAX_ERROR_CHARS,
    MAX_LOG_LINE_CHARS,
    MAX_LOG_TAIL_LINES,
    MAX_MESSAGE_BYTES,
    MAX_STOP_GRACE_S,
    PROTOCOL_VERSION,
    CloseCode,
    CommandResult,
    GpuHealthChange,
    Heartbeat,
    HeartbeatAck,
    HeartbeatShard,
    Hello,
    ShardStatus,
    StartShard,
    StopShard,
    Welcome,
    decode_from_agent,
    encode,
)

INTERVAL_S = 5.0
WELCOME = Welcome(
    protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=INTERVAL_S, server_id="cp-a", epoch=3
)
NO_NEWS = HeartbeatContent()
HELLO = Hello(
    protocol_version=PROTOCOL_VERSION,
    node_id="gpu-1",
    agent_version="0.1.0",
    address="127.0.0.7",
    port_range=(20000, 20999),
)


def start(command_id: str = "c-1") -> StartShard:
    return StartShard(
        command_id=command_id,
        replica_id="llama-1",
        shard_index=0,
        model="llama",
        argv=("vllm", "serve", "llama"),
        gpus=(0, 1),
        port=20001,
    )


def new_session(
    *,
    now: float = 0.0,
    commands: CommandLedger | None = None,
    heartbeat_content: HeartbeatContent = NO_NEWS,
) -> ServerSession:
    return ServerSession(
        node_id="gpu-1",
        hello_factory=lambda: HELLO,
        now=now,
        heartbeat_content=lambda: heartbeat_content,
        welcome_timeout_s=10.0,
        silent_server_intervals=3,
        commands=commands,
    )


def active(now: float = 0.0, commands: CommandLedger | None = None) -> ServerSession:
    session = new_session(now=now, commands=commands)
    session.opened(now)
    assert session.receive(encode(WELCOME), now) == []
    return session


# -- handshake ----------------------------------------------------------------------------


def test_the_agent_says_hello_and_is_welcomed() -> None:
    session = new_session()
    states = [session.state]

    assert session.opened(now=0.0) == [Send(HELLO)]
    states.append(session.state)

    assert session.receive(encode(WELCOME), now=0.2) == []
    states.append(session.state)

    assert states == [SessionState.CONNECTING, SessionState.AWAITING_WELCOME, SessionState.ACTIVE]
    assert session.welcome == WELCOME


def test_the_hello_carries_the_inventory_as_it_is_when_the_connection_opens() -> None:
    inventory = [HELLO]
    session = ServerSession(node_id="gpu-1", hello_factory=lambda: inventory[-1], now=0.0)
    relabelled = replace(HELLO, labels={"zone": "b"})
    inventory.append(relabelled)

    assert session.opened(now=1.0) == [Send(relabelled)]


def test_a_hello_for_another_node_is_a_bug_in_the_caller() -> None:
    session = ServerSession(node_id="gpu-2", hello_factory=lambda: HELLO, now=0.0)
    with pytest.raises(ValueError, match="'gpu-1', not 'gpu-2'"):
        session.opened(now=0.0)


def test_the_session_is_opened_once_and_before_anything_arrives() -> None:
    session = new_session()
    with pytest.raises(SessionStateError):
        session.receive(encode(WELCOME), now=0.0)
    session.opened(now=0.0)
    with pytest.raises(SessionStateError, match="opened twice"):
        session.opened(now=0.1)


def test_a_command_before_welcome_is_refused() -> None:
    session = new_session()
    session.opened(now=0.0)
    assert session.receive(encode(start()), now=0.1) == [
        Close(CloseCode.PROTOCOL_ERROR, "expected welcome, got start_shard")
    ]
    assert session.state is SessionState.CLOSED


def test_a_welcome_in_another_version_is_refused_naming_both() -> None:
    session = new_session()
    session.opened(now=0.0)
    outputs = session.receive(encode(replace(WELCOME, protocol_version=9)), now=0.1)
    assert outputs == [
        Close(
            CloseCode.PROTOCOL_ERROR,
            "protocol version 9 is not supported; this side speaks version 1",
        )
    ]


def test_welcome_twice_is_refused() -> None:
    session = active()
    assert session.receive(encode(WELCOME), now=1.0) == [
        Close(CloseCode.PROTOCOL_ERROR, "welcome twice")
    ]


def test_no_welcome_in_time_closes() -> None:
    session = new_session()
    session.opened(now=100.0)
    assert session.tick(now=110.0) == []
    assert session.tick(now=110.5) == [Close(CloseCode.TIMED_OUT, "no welcome within 10s")]
    assert session.state is SessionState.CLOSED


@pytest.mark.parametrize(
    ("data", "code", "reason"),
    [
        (b"\xfe\xff garbage", CloseCode.PROTOCOL_ERROR, "not valid JSON"),
        (b'{"type": "gossip"}', CloseCode.PROTOCOL_ERROR, "unknown message type 'gossip'"),
        (encode(HELLO), CloseCode.PROTOCOL_ERROR, "'hello' is not a message an agent receives"),
        (
            b'{"type": "stop_shard", "command_id": "c-1", "replica_id": "m-1", "shard_index": 0}',
            CloseCode.PROTOCOL_ERROR,
            "malformed stop_shard: Object missing required field `grace_s`",
        ),
        (b" " * (MAX_MESSAGE_BYTES + 1), CloseCode.MESSAGE_TOO_BIG, "over the 1048576-byte limit"),
    ],
)
def test_bad_input_from_the_server_closes_with_a_reason(
    data: bytes, code: CloseCode, reason: str
) -> None:
    session = active()
    outputs = session.receive(data, now=1.0)
    assert len(outputs) == 1
    assert isinstance(outputs[0], Close)
    assert outputs[0].code == code
    assert reason in outputs[0].reason
    assert session.state is SessionState.CLOSED
    assert session.receive(encode(start()), now=2.0) == []
    assert session.tick(now=100.0) == []


@pytest.mark.parametrize(
    ("grace", "why"),
    [
        ("-1", "Expected `float` >= 0.0"),
        ("3600.5", "Expected `float` <= 3600.0"),
        ("1e12", "Expected `float` <= 3600.0"),
        ("1e999", "Number out of range"),  # what infinity is in JSON
        ("null", "Expected `float`, got `null`"),  # how msgspec and JSON spell NaN
        ("NaN", "not valid JSON"),
        ('"inf"', "Expected `float`, got `str`"),
    ],
)
def test_a_stop_with_a_grace_outside_zero_to_an_hour_closes_and_stops_nothing(
    grace: str, why: str
) -> None:
    session = active()
    stop = (
        '{"type": "stop_shard", "command_id": "c-9", "replica_id": "llama-1", '
        f'"shard_index": 0, "grace_s": {grace}}}'
    )

    outputs = session.receive(stop.encode(), now=1.0)

    assert [type(output) for output in outputs] == [Close], "nothing is executed"
    close = outputs[0]
    assert isinstance(close, Close)
    assert close.code == CloseCode.PROTOCOL_ERROR
    assert why in close.reason
    assert session.state is SessionState.CLOSED


def test_the_longest_grace_a_stop_may_give_is_the_one_a_model_spec_may_ask_for() -> None:
    session = active()
    longest = StopShard(
        command_id="c-9", replica_id="llama-1", shard_index=0, grace_s=MAX_STOP_GRACE_S
    )

    assert session.receive(encode(longest), now=1.0) == [Execute(longest)]
    assert MAX_STOP_GRACE_S == model_spec.MAX_STOP_GRACE_S


# -- commands -----------------------------------------------------------------------------


def test_commands_are_executed_and_their_results_sent() -> None:
    session = active()
    stop = StopShard(command_id="c-2", replica_id="llama-1", shard_index=0, grace_s=30.0)

    assert session.receive(encode(start("c-1")), now=1.0) == [Execute(start("c-1"))]
    assert session.receive(encode(stop), now=1.5) == [Execute(stop)]
    assert session.command_finished("c-1", ok=True) == [
        Send(CommandResult(command_id="c-1", ok=True))
    ]


def test_a_repeated_command_is_not_executed_again_and_its_result_is_resent() -> None:
    session = active()
    session.receive(encode(start("c-1")), now=1.0)

    assert session.receive(encode(start("c-1")), now=1.1) == []  # still running
    session.command_finished("c-1", ok=False, error="port 20001 in use")
    assert session.receive(encode(start("c-1")), now=2.0) == [
        Send(CommandResult(command_id="c-1", ok=False, error="port 20001 in use"))
    ]


def test_commands_stay_idempotent_across_reconnects() -> None:
    ledger = CommandLedger()
    first = active(commands=ledger)
    first.receive(encode(start("c-1")), now=1.0)
    first.connection_lost()
    assert first.command_finished("c-1", ok=True) == []  # nowhere to send it

    second = active(now=10.0, commands=ledger)
    assert second.receive(encode(start("c-1")), now=10.5) == [
        Send(CommandResult(command_id="c-1", ok=True))
    ]


def test_only_the_newest_command_ids_are_remembered() -> None:
    session = active(commands=CommandLedger(capacity=3))
    for n in range(4):
        session.receive(encode(start(f"c-{n}")), now=1.0)
        session.command_finished(f"c-{n}", ok=True)

    assert session.receive(encode(start("c-3")), now=2.0) == [
        Send(CommandResult(command_id="c-3", ok=True))
    ]
    assert session.receive(encode(start("c-0")), now=2.0) == [Execute(start("c-0"))]


def test_a_long_command_error_is_cut() -> None:
    session = active()
    (send,) = session.command_finished("c-9", ok=False, error="e" * 50_000)
    assert isinstance(send, Send)
    assert isinstance(send.message, CommandResult)
    assert send.message.error is not None
    assert len(send.message.error) == MAX_ERROR_CHARS


# -- heartbeats and a silent server -------------------------------------------------------


def test_heartbeats_go_out_every_interval_with_a_growing_seq() -> None:
    content = HeartbeatContent(
        gpu_changes=(
            GpuHealthChange(index=1, uuid="GPU-1", healthy=False, reason="Xid 79", xid=79),
        ),
        shards=(HeartbeatShard(replica_id="llama-1", shard_index=0, state="ready"),),
    )
    session = new_session(heartbeat_content=content)
    session.opened(now=0.0)
    session.receive(encode(WELCOME), now=0.0)

    sent: list[tuple[float, Heartbeat]] = []
    for step in range(1, 201):
        now = step / 10
        for output in session.tick(now):
            assert isinstance(output, Send)
            assert isinstance(output.message, Heartbeat)
            sent.append((now, output.message))
            session.receive(encode(HeartbeatAck(seq=output.message.seq)), now)

    assert [at for at, _ in sent] == [5.0, 10.0, 15.0, 20.0]
    assert [beat.seq for _, beat in sent] == [0, 1, 2, 3]
    assert all(beat.gpu_changes == content.gpu_changes for _, beat in sent)
    assert all(beat.shards == content.shards for _, beat in sent)


def test_a_late_tick_sends_one_heartbeat_not_a_burst() -> None:
    session = active(now=0.0)
    session.receive(encode(HeartbeatAck(seq=0)), now=12.0)

    assert len(session.tick(now=12.0)) == 1  # due at 5 and at 10: one heartbeat, not two
    assert session.tick(now=12.1) == []
    assert session.tick(now=16.9) == []
    assert len(session.tick(now=17.0)) == 1


def test_a_slightly_late_tick_keeps_the_cadence() -> None:
    session = active(now=0.0)
    assert len(session.tick(now=5.4)) == 1
    assert session.tick(now=9.9) == []
    assert len(session.tick(now=10.0)) == 1


def test_a_silent_server_is_left_after_three_intervals() -> None:
    session = active(now=0.0)
    session.tick(now=5.0)
    session.tick(now=10.0)
    session.tick(now=15.0)

    outputs = session.tick(now=15.5)

    assert outputs == [Close(CloseCode.TIMED_OUT, "nothing from the server for 15.5s")]
    assert session.state is SessionState.CLOSED


def test_acknowledged_heartbeats_keep_the_connection() -> None:
    session = active(now=0.0)
    for second in range(1, 120):
        for output in session.tick(float(second)):
            assert isinstance(output, Send)
            assert isinstance(output.message, Heartbeat)
            session.receive(encode(HeartbeatAck(seq=output.message.seq)), float(second))
    assert session.state is SessionState.ACTIVE


# -- shard reports ------------------------------------------------------------------------


def test_shard_changes_are_reported_while_active_and_dropped_otherwise() -> None:
    status = ShardStatus(replica_id="llama-1", shard_index=0, state="ready", pid=42, port=20001)
    session = new_session()
    assert session.report_shard(status) == []
    session.opened(now=0.0)
    assert session.report_shard(status) == []

    session.receive(encode(WELCOME), now=0.1)
    assert session.report_shard(status) == [Send(status)]

    session.connection_lost()
    assert session.report_shard(status) == []


def test_a_failed_shards_log_tail_is_cut_to_fit_the_wire() -> None:
    lines = tuple(f"line {n} " + "x" * 5000 for n in range(250))
    status = ShardStatus(
        replica_id="llama-1",
        shard_index=0,
        state="failed",
        port=20001,
        error="exited with 1",
        exit_code=1,
        log_tail=lines,
    )

    (send,) = active().report_shard(status)

    assert isinstance(send, Send)
    sent = decode_from_agent(encode(send.message))
    assert isinstance(sent, ShardStatus)
    assert len(sent.log_tail) == MAX_LOG_TAIL_LINES
    assert sent.log_tail[0].startswith("line 150 ")
    assert sent.log_tail[-1].startswith("line 249 ")
    assert all(len(line) == MAX_LOG_LINE_CHARS for line in sent.log_tail)
    assert sent.error == "exited with 1"
