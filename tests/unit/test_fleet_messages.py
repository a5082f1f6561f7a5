"""The wire messages: every message round-trips, and every bad input gets a precise error."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import get_args

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire.errors import (
    MalformedMessage,
    MessageTooLarge,
    ProtocolError,
    UnknownMessageType,
    UnsupportedVersion,
)
from wire.messages import (
    MAX_CLOSE_REASON_BYTES,
    MAX_ERROR_CHARS,
    MAX_EXIT_CODE,
    MAX_LISTED,
    MAX_LOG_LINE_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_PID,
    MAX_STOP_GRACE_S,
    MAX_XID,
    PROTOCOL_VERSION,
    AgentMessage,
    CommandResult,
    GpuHealthChange,
    GpuMemoryReading,
    GpuReport,
    Heartbeat,
    HeartbeatAck,
    HeartbeatShard,
    Hello,
    Peer,
    ServerMessage,
    ShardReport,
    ShardStatus,
    StartShard,
    StopShard,
    Welcome,
    decode_from_agent,
    decode_from_server,
    encode,
    fit_close_reason,
    message_type,
)

# -- strategies for every message ---------------------------------------------------------

text = st.text(max_size=12)
no_controls = st.characters(codec="utf-8", exclude_characters=[*map(chr, range(0x20)), "\x7f"])
"""What a name on the wire may hold (``wire.messages.NO_CONTROL_CHARACTERS``)."""
plain_text = st.text(no_controls, max_size=12)
name = st.text(no_controls, min_size=1, max_size=12)
index = st.integers(min_value=0, max_value=2**31)
listed_index = st.integers(min_value=0, max_value=MAX_LISTED - 1)
port = st.integers(min_value=1, max_value=65535)
maybe_pid = st.none() | st.integers(min_value=1, max_value=MAX_PID)
maybe_exit_code = st.none() | st.integers(min_value=-MAX_EXIT_CODE, max_value=MAX_EXIT_CODE)
maybe_xid = st.none() | st.integers(min_value=0, max_value=MAX_XID)
maybe_text = st.none() | text
shard_state = st.sampled_from(["starting", "ready", "failed", "stopped"])
labels = st.dictionaries(name, plain_text, max_size=3)
offsets = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
aware_datetimes = st.datetimes(timezones=offsets)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, exclude_min=True)

gpu_reports = st.builds(
    GpuReport,
    index=listed_index,
    uuid=plain_text,
    name=text,
    memory_total_mib=index,
    memory_used_mib=index,
    healthy=st.booleans(),
    unhealthy_reason=maybe_text,
)
shard_reports = st.builds(
    ShardReport,
    replica_id=name,
    shard_index=listed_index,
    model=plain_text,
    port=port,
    gpus=st.tuples(listed_index) | st.tuples(listed_index, listed_index),
    pid=maybe_pid,
    state=shard_state,
    started_at=aware_datetimes,
)
hellos = st.builds(
    Hello,
    protocol_version=st.just(PROTOCOL_VERSION),
    node_id=name,
    agent_version=plain_text,
    address=name,
    labels=labels,
    port_range=st.tuples(port, port).map(lambda pair: (min(pair), max(pair))),
    gpus=st.lists(gpu_reports, max_size=3).map(tuple),
    shards=st.lists(shard_reports, max_size=3).map(tuple),
)
heartbeats = st.builds(
    Heartbeat,
    seq=index,
    gpu_changes=st.lists(
        st.builds(
            GpuHealthChange,
            index=listed_index,
            uuid=plain_text,
            healthy=st.booleans(),
            reason=maybe_text,
            xid=maybe_xid,
        ),
        max_size=3,
    ).map(tuple),
    shards=st.lists(
        st.builds(HeartbeatShard, replica_id=name, shard_index=listed_index, state=shard_state),
        max_size=3,
    ).map(tuple),
)
shard_statuses = st.builds(
    ShardStatus,
    replica_id=name,
    shard_index=listed_index,
    state=shard_state,
    pid=maybe_pid,
    port=port,
    error=maybe_text,
    exit_code=maybe_exit_code,
    log_tail=st.lists(text, max_size=100).map(tuple),
    command_id=st.none() | name,
)
command_results = st.builds(CommandResult, command_id=name, ok=st.booleans(), error=maybe_text)
welcomes = st.builds(
    Welcome,
    protocol_version=st.just(PROTOCOL_VERSION),
    heartbeat_interval_s=seconds,
    server_id=text,
    epoch=index,
)
acks = st.builds(HeartbeatAck, seq=index)
start_shards = st.builds(
    StartShard,
    command_id=name,
    replica_id=name,
    shard_index=index,
    model=text,
    argv=st.lists(text, min_size=1, max_size=4).map(tuple),
    env=labels,
    gpus=st.lists(index, max_size=4).map(tuple),
    port=port,
    peers=st.lists(st.builds(Peer, shard_index=index, address=name, port=port), max_size=2).map(
        tuple
    ),
)
graces = st.floats(min_value=0, max_value=MAX_STOP_GRACE_S)
stop_shards = st.builds(
    StopShard, command_id=name, replica_id=name, shard_index=index, grace_s=graces
)
agent_messages = st.one_of(hellos, heartbeats, shard_statuses, command_results)
server_messages = st.one_of(welcomes, acks, start_shards, stop_shards)


# -- round trips --------------------------------------------------------------------------


@given(agent_messages)
def test_every_agent_message_round_trips_as_bytes_and_as_text(message: AgentMessage) -> None:
    data = encode(message)
    assert decode_from_agent(data) == message
    assert decode_from_agent(data.decode()) == message


@given(server_messages)
def test_every_server_message_round_trips_as_bytes_and_as_text(message: ServerMessage) -> None:
    data = encode(message)
    assert decode_from_server(data) == message
    assert decode_from_server(data.decode()) == message


@given(st.one_of(agent_messages, server_messages))
def test_the_wire_names_each_message_by_its_snake_case_type(
    message: AgentMessage | ServerMessage,
) -> None:
    assert json.loads(encode(message))["type"] == message_type(message)


def test_the_wire_types_are_the_documented_ones() -> None:
    tags = {
        cls.__struct_config__.tag for cls in (*get_args(AgentMessage), *get_args(ServerMessage))
    }
    assert tags == {
        "hello",
        "heartbeat",
        "shard_status",
        "command_result",
        "welcome",
        "heartbeat_ack",
        "start_shard",
        "stop_shard",
    }


@given(st.binary(max_size=200) | st.text(max_size=200))
def test_any_input_either_decodes_or_raises_a_protocol_error(data: bytes | str) -> None:
    for decode in (decode_from_agent, decode_from_server):
        try:
            message = decode(data)
        except ProtocolError:
            continue
        assert isinstance(message, msgspec.Struct)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=10,
)


@given(
    st.sampled_from(["hello", "heartbeat", "shard_status", "welcome", "start_shard", "x"]),
    st.dictionaries(text, json_values, max_size=5),
)
def test_any_json_object_either_decodes_or_raises_a_protocol_error(
    message_type_: str, fields: dict[str, object]
) -> None:
    data = json.dumps({**fields, "type": message_type_})
    for decode in (decode_from_agent, decode_from_server):
        try:
            message = decode(data)
        except ProtocolError:
            continue
        assert isinstance(message, msgspec.Struct)


# -- precise errors -----------------------------------------------------------------------


def test_garbage_bytes_are_malformed() -> None:
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        decode_from_agent(b"\xff\xfe\x00garbage")


def test_invalid_json_is_malformed() -> None:
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        decode_from_server('{"type": "welcome",')


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("[1, 2]", "Expected `object`, got `array`"),
        ('{"seq": 1}', "missing required field `type`"),
        ('{"type": 7}', "Expected `str`"),
    ],
)
def test_json_that_is_not_a_message_is_malformed(data: str, expected: str) -> None:
    with pytest.raises(MalformedMessage, match=expected):
        decode_from_agent(data)


def test_a_wrong_field_type_is_malformed_and_names_the_path() -> None:
    data = '{"type": "heartbeat", "seq": 1, "shards": [{"replica_id": "m-1", "shard_index": "0"}]}'
    with pytest.raises(MalformedMessage) as caught:
        decode_from_agent(data)
    assert str(caught.value) == (
        "malformed heartbeat: Expected `int`, got `str` - at `$.shards[0].shard_index`"
    )


@pytest.mark.parametrize(
    ("decode", "message_type"),
    [(decode_from_agent, "heartbeat"), (decode_from_server, "heartbeat_ack")],
)
def test_json_nested_thousands_deep_is_malformed_not_a_crash(
    decode: Callable[[str], object], message_type: str
) -> None:
    # Unknown fields are skipped, recursively: the one place the decoder goes that deep.
    deep = "[" * 100_000 + "]" * 100_000
    data = f'{{"type": "{message_type}", "seq": 1, "extra": {deep}}}'
    with pytest.raises(MalformedMessage, match=r"^malformed message: JSON nested too deeply$"):
        decode(data)


def test_an_unknown_shard_state_is_malformed() -> None:
    shard = {"replica_id": "m-1", "shard_index": 0, "state": "sleepy"}
    data = json.dumps({"type": "heartbeat", "seq": 1, "shards": [shard]})
    with pytest.raises(MalformedMessage, match=r"\$\.shards\[0\]\.state"):
        decode_from_agent(data)


def test_an_unknown_type_is_named() -> None:
    with pytest.raises(UnknownMessageType, match="unknown message type 'gossip'") as caught:
        decode_from_agent('{"type": "gossip"}')
    assert caught.value.message_type == "gossip"


@pytest.mark.parametrize(
    ("decode", "data", "expected"),
    [
        (
            decode_from_agent,
            '{"type": "start_shard"}',
            "'start_shard' is not a message the control plane receives",
        ),
        (
            decode_from_server,
            '{"type": "heartbeat", "seq": 1}',
            "'heartbeat' is not a message an agent receives",
        ),
    ],
)
def test_a_message_for_the_other_side_is_an_unknown_type(
    decode: Callable[[str], object], data: str, expected: str
) -> None:
    with pytest.raises(UnknownMessageType, match=expected):
        decode(data)


def test_a_message_over_the_limit_is_too_large_before_it_is_parsed() -> None:
    data = b"{" + b" " * MAX_MESSAGE_BYTES + b"}"
    with pytest.raises(MessageTooLarge) as caught:
        decode_from_agent(data)
    assert caught.value.size == MAX_MESSAGE_BYTES + 2
    assert caught.value.limit == MAX_MESSAGE_BYTES


def test_text_is_measured_in_utf8_bytes_not_characters() -> None:
    three_bytes_each = "€" * (MAX_MESSAGE_BYTES // 3 + 1)
    assert len(three_bytes_each) < MAX_MESSAGE_BYTES
    with pytest.raises(MessageTooLarge):
        decode_from_server(
            json.dumps({"type": "welcome", "server_id": three_bytes_each}, ensure_ascii=False)
        )


def test_a_message_exactly_at_the_limit_is_accepted() -> None:
    def start(argument: str) -> StartShard:
        return StartShard(
            command_id="c-1",
            replica_id="m-1",
            shard_index=0,
            model="m",
            argv=("engine", argument),
            gpus=(0,),
            port=20001,
        )

    padding = "x" * (MAX_MESSAGE_BYTES - len(encode(start(""))))
    data = encode(start(padding))
    assert len(data) == MAX_MESSAGE_BYTES
    assert decode_from_server(data.decode()) == start(padding)


def test_encode_refuses_what_the_other_side_would_refuse() -> None:
    with pytest.raises(MessageTooLarge):
        encode(CommandResult(command_id="c-1", ok=False, error="x" * MAX_MESSAGE_BYTES))


def test_a_hello_in_another_version_names_both_versions() -> None:
    data = encode(_hello(protocol_version=PROTOCOL_VERSION + 1))
    with pytest.raises(UnsupportedVersion) as caught:
        decode_from_agent(data)
    assert (caught.value.offered, caught.value.supported) == (
        PROTOCOL_VERSION + 1,
        PROTOCOL_VERSION,
    )
    assert str(caught.value) == (
        f"protocol version {PROTOCOL_VERSION + 1} is not supported; "
        f"this side speaks version {PROTOCOL_VERSION}"
    )


def test_a_later_version_with_another_shape_is_still_a_version_mismatch() -> None:
    with pytest.raises(UnsupportedVersion):
        decode_from_agent('{"type": "hello", "protocol_version": 2, "identity": {"node": "gpu-1"}}')
    with pytest.raises(UnsupportedVersion):
        decode_from_server('{"type": "welcome", "protocol_version": 2, "cadence": "fast"}')


def test_a_welcome_in_another_version_is_refused() -> None:
    welcome = Welcome(protocol_version=0, heartbeat_interval_s=5.0, server_id="cp", epoch=1)
    with pytest.raises(UnsupportedVersion, match="version 0 is not supported"):
        decode_from_server(encode(welcome))


def test_fields_this_version_does_not_know_are_ignored() -> None:
    data = json.loads(encode(HeartbeatAck(seq=4)))
    data["added_in_a_later_minor_change"] = {"anything": [1, 2]}
    assert decode_from_server(json.dumps(data)) == HeartbeatAck(seq=4)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"port_range": [21000, 20000]}, "port_range [21000, 20000] is empty"),
        ({"port_range": [0, 10]}, "$.port_range[0]"),
        ({"node_id": ""}, "$.node_id"),
        (
            {
                "shards": [
                    {
                        "replica_id": "m-1",
                        "shard_index": 0,
                        "model": "m",
                        "port": 20001,
                        "gpus": [0],
                        "pid": 1,
                        "state": "ready",
                        "started_at": "2025-01-01T00:00:00",
                    }
                ]
            },
            "$.shards[0].started_at",
        ),
    ],
)
def test_hello_values_out_of_range_are_malformed(change: dict[str, object], path: str) -> None:
    data = {**json.loads(encode(_hello())), **change}
    with pytest.raises(MalformedMessage) as caught:
        decode_from_agent(json.dumps(data))
    assert path in str(caught.value)


_STATUS = ShardStatus(replica_id="m-1", shard_index=0, state="failed", port=20001)


def _status(**change: object) -> Callable[[], AgentMessage]:
    return lambda: msgspec.structs.replace(_STATUS, **change)


def _gpu_change(index: int = 0, xid: int | None = None) -> Callable[[], AgentMessage]:
    change = GpuHealthChange(index=index, uuid="GPU-0", healthy=False, xid=xid)
    return lambda: Heartbeat(seq=0, gpu_changes=(change,))


OUT_OF_RANGE: dict[str, tuple[Callable[[], AgentMessage], str]] = {
    "pid 2**63": (_status(pid=2**63), "$.pid"),
    "pid 2**31": (_status(pid=MAX_PID + 1), "$.pid"),
    "pid 0": (_status(pid=0), "$.pid"),
    "pid -5": (_status(pid=-5), "$.pid"),
    "exit code 10**12": (_status(exit_code=10**12), "$.exit_code"),
    "exit code -256": (_status(exit_code=-256), "$.exit_code"),
    "shard index 2**40": (_status(shard_index=2**40), "$.shard_index"),
    "an error of a megabyte": (_status(error="x" * (MAX_ERROR_CHARS + 1)), "$.error"),
    "a log line too long": (
        _status(log_tail=("ok", "x" * (MAX_LOG_LINE_CHARS + 1))),
        "$.log_tail[1]",
    ),
    "an empty command id": (_status(command_id=""), "$.command_id"),
    "a command error too long": (
        lambda: CommandResult(command_id="c", ok=False, error="x" * (MAX_ERROR_CHARS + 1)),
        "$.error",
    ),
    "xid 2**40": (_gpu_change(xid=2**40), "$.gpu_changes[0].xid"),
    "GPU index 10**9": (_gpu_change(index=10**9), "$.gpu_changes[0].index"),
    "a heartbeat seq of 2**70": (lambda: Heartbeat(seq=2**70), "$.seq"),
    "a shard's pid in a hello": (
        lambda: _hello(shards=(msgspec.structs.replace(_shard_report(), pid=2**63),)),
        "$.shards[0].pid",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_numbers_and_texts_out_of_range_are_malformed_and_name_the_field(case: str) -> None:
    """Before, msgspec took any integer of any size and any string up to the frame limit: a
    pid of 2**40 reached the log, where no shards row could hold it."""
    message, path = OUT_OF_RANGE[case]
    with pytest.raises(MalformedMessage) as caught:
        decode_from_agent(encode(message()))
    assert path in str(caught.value)


@pytest.mark.parametrize(
    "status",
    [
        msgspec.structs.replace(_STATUS, pid=1, exit_code=-MAX_EXIT_CODE),
        msgspec.structs.replace(_STATUS, pid=MAX_PID, exit_code=MAX_EXIT_CODE),
        msgspec.structs.replace(
            _STATUS,
            error="x" * MAX_ERROR_CHARS,
            log_tail=("x" * MAX_LOG_LINE_CHARS,) * 100,
            command_id="start-m-1-0",
        ),
    ],
)
def test_values_at_the_bounds_are_accepted(status: ShardStatus) -> None:
    assert decode_from_agent(encode(status)) == status


NAMES_WITH_CONTROLS: dict[str, tuple[Callable[[], AgentMessage], str]] = {
    "a NUL in a status's replica id": (_status(replica_id="m\x00-1"), "$.replica_id"),
    "an escape in a command id": (_status(command_id="start\x1b[2J"), "$.command_id"),
    "a DEL in a result's command id": (
        lambda: CommandResult(command_id="c\x7f", ok=True),
        "$.command_id",
    ),
    "a line break in a GPU change's UUID": (
        lambda: Heartbeat(
            seq=0, gpu_changes=(GpuHealthChange(index=0, uuid="GPU-0\n", healthy=True),)
        ),
        "$.gpu_changes[0].uuid",
    ),
    "a tab in a hello's node id": (
        lambda: msgspec.structs.replace(_hello(), node_id="gpu\t7"),
        "$.node_id",
    ),
    "a carriage return in an agent version": (
        lambda: msgspec.structs.replace(_hello(), agent_version="1.0\r"),
        "$.agent_version",
    ),
}


@pytest.mark.parametrize("case", sorted(NAMES_WITH_CONTROLS))
def test_a_name_holding_a_control_character_is_malformed_and_named(case: str) -> None:
    """Before, any character was taken: a NUL in a stray's replica id was recorded as
    U+FFFD, so the stray never matched its record and was recorded again at every pass."""
    message, path = NAMES_WITH_CONTROLS[case]
    with pytest.raises(MalformedMessage) as caught:
        decode_from_agent(encode(message()))
    assert path in str(caught.value)


def test_free_text_may_hold_any_character() -> None:
    status = msgspec.structs.replace(
        _STATUS,
        error="boom\x00\x1b[31m",
        log_tail=("a\tb\r", "\x00"),
        replica_id="m-1 \u00e9\u202e",
    )
    assert decode_from_agent(encode(status)) == status


def test_a_log_tail_over_100_lines_is_malformed() -> None:
    status = ShardStatus(
        replica_id="m-1", shard_index=0, state="failed", port=20001, log_tail=("line",) * 101
    )
    with pytest.raises(MalformedMessage, match=r"\$\.log_tail"):
        decode_from_agent(encode(status))


def test_started_at_travels_as_iso_8601() -> None:
    started = datetime(2025, 3, 1, 12, 30, 5, 250000, tzinfo=UTC)
    hello = _hello(shards=(_shard_report(started_at=started),))
    assert json.loads(encode(hello))["shards"][0]["started_at"] == "2025-03-01T12:30:05.250000Z"


@pytest.mark.parametrize("reason", ["short", "x" * 500, "é" * 100, "€" * 60 + "abc"])
def test_close_reasons_are_cut_to_fit_a_close_frame(reason: str) -> None:
    fitted = fit_close_reason(reason)
    assert len(fitted.encode()) <= MAX_CLOSE_REASON_BYTES
    if len(reason.encode()) <= MAX_CLOSE_REASON_BYTES:
        assert fitted == reason
    else:
        assert fitted.endswith("...")
        assert reason.startswith(fitted.removesuffix("..."))


def test_decoded_messages_are_frozen() -> None:
    message = decode_from_server(encode(HeartbeatAck(seq=1)))
    assert isinstance(message, HeartbeatAck)
    with pytest.raises(AttributeError):
        message.seq = 2  # type: ignore[misc]
    assert msgspec.structs.replace(message, seq=2) == HeartbeatAck(seq=2)


def _shard_report(*, started_at: datetime = datetime(2025, 1, 1, tzinfo=UTC)) -> ShardReport:
    return ShardReport(
        replica_id="llama-1",
        shard_index=0,
        model="llama",
        port=20001,
        gpus=(0, 1),
        pid=4242,
        state="ready",
        started_at=started_at,
    )


def _hello(
    *, protocol_version: int = PROTOCOL_VERSION, shards: tuple[ShardReport, ...] = ()
) -> Hello:
    return Hello(
        protocol_version=protocol_version,
        node_id="gpu-1",
        agent_version="0.1.0",
        address="127.0.0.7",
        labels={"zone": "a"},
        port_range=(20000, 20999),
        gpus=(
            GpuReport(
                index=0,
                uuid="GPU-0",
                name="H100",
                memory_total_mib=81559,
                memory_used_mib=0,
                healthy=True,
            ),
        ),
        shards=shards,
    )


def test_a_start_shard_without_an_engine_means_the_default_one() -> None:
    """A control plane from before engine profiles sends none: vLLM's probes, as then."""
    sent = {
        "type": "start_shard",
        "command_id": "start-m-1-0",
        "replica_id": "m-1",
        "shard_index": 0,
        "model": "m",
        "argv": ["vllm", "serve"],
        "gpus": [0],
        "port": 8001,
    }
    message = decode_from_server(json.dumps(sent))
    assert isinstance(message, StartShard)
    assert message.engine == "vllm"
    llamacpp = decode_from_server(json.dumps({**sent, "engine": "llamacpp"}))
    assert isinstance(llamacpp, StartShard)
    assert llamacpp.engine == "llamacpp"


@pytest.mark.parametrize(
    ("readings", "path"),
    [
        ([{"index": 0, "uuid": "GPU-0", "used_mib": -1}], r"\$\.gpu_memory\[0\]\.used_mib"),
        ([{"index": i, "uuid": f"GPU-{i}", "used_mib": 0} for i in range(65)], r"\$\.gpu_memory"),
    ],
)
def test_a_memory_reading_out_of_bounds_is_malformed(readings: list[object], path: str) -> None:
    data = json.dumps({"type": "heartbeat", "seq": 1, "gpu_memory": readings})
    with pytest.raises(MalformedMessage, match=path):
        decode_from_agent(data)


def test_a_heartbeat_without_memory_readings_leaves_the_field_out_for_older_peers() -> None:
    reading = GpuMemoryReading(index=0, uuid="GPU-0", used_mib=30_000)

    quiet = json.loads(encode(Heartbeat(seq=1)))
    with_reading = json.loads(encode(Heartbeat(seq=2, gpu_memory=(reading,))))

    assert quiet == {"type": "heartbeat", "seq": 1}
    assert with_reading["gpu_memory"] == [{"index": 0, "uuid": "GPU-0", "used_mib": 30_000}]
    assert decode_from_agent(encode(Heartbeat(seq=2, gpu_memory=(reading,)))) == Heartbeat(
        seq=2, gpu_memory=(reading,)
    )
