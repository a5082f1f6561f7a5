"""A failed shard's reason on the wire (``ShardReport.failure``): one line without control
characters, cut to the room its report has left of its share of the hello, left out when
there is none, and refused (the hello malformed) when a node sends one beyond its bounds.
A status failing a shard because another process holds its port says so
(``ShardStatus.port_held_elsewhere``), and an older agent's, without the field, does not."""

from __future__ import annotations

import msgspec
import pytest

from agent.engines import ShardState
from agent.engines.changes import ShardChange
from agent.reports import json_bytes, shard_report, shard_status
from app.domain.reports import ShardStatusReport
from app.hub.edge import report_of
from app.hub.session import ShardStatusReported
from tests.unit.test_failed_shard_reasons import STARTED, a_record
from wire.errors import MalformedMessage
from wire.messages import (
    MAX_FAILURE_CHARS,
    MAX_SHARD_REPORT_BYTES,
    PROTOCOL_VERSION,
    Hello,
    ShardReport,
    ShardStatus,
    decode_from_agent,
    encode,
)


def test_a_reason_with_control_characters_is_listed_with_them_replaced() -> None:
    report = shard_report(a_record(ShardState.FAILED), "exited\n\x1b[31mred\x00")

    assert report.failure == "exited\ufffd\ufffd[31mred\ufffd"
    assert decode_from_agent(encode(a_hello(report))) == a_hello(report)


def test_a_long_reason_is_cut_to_the_room_its_report_has_left() -> None:
    """However long the reason, the report takes no more than its share of the hello."""
    short_ids = shard_report(a_record(ShardState.FAILED), "\U0001f600" * 5000)
    long_ids = shard_report(
        a_record(ShardState.FAILED, replica_id="r" * 300, model="m" * 200), "x" * 5000
    )

    assert short_ids.failure is not None
    assert len(short_ids.failure) < MAX_FAILURE_CHARS
    assert json_bytes(short_ids) <= MAX_SHARD_REPORT_BYTES
    assert long_ids.failure == "x" * len(long_ids.failure or "")
    assert json_bytes(long_ids) == MAX_SHARD_REPORT_BYTES
    plain = shard_report(a_record(ShardState.FAILED), "x" * 5000)
    assert plain.failure == "x" * MAX_FAILURE_CHARS


def test_only_a_failed_shard_carries_a_reason_and_none_adds_nothing_to_the_wire() -> None:
    """A report without a reason is the bytes agents sent before the field existed."""
    ready = shard_report(a_record(ShardState.READY), "stale")

    assert ready.failure is None
    assert b"failure" not in encode(a_hello(ready))


# -- the wire ----------------------------------------------------------------------------


def a_hello(*shards: ShardReport) -> Hello:
    return Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id="gpu-1",
        agent_version="1.0",
        address="127.0.0.1",
        port_range=(20000, 20999),
        shards=shards,
    )


def listed_failed(failure: str | None) -> ShardReport:
    return ShardReport(
        replica_id="llama-1",
        shard_index=0,
        model="llama",
        port=20000,
        gpus=(0,),
        pid=77,
        state="failed",
        started_at=STARTED,
        failure=failure,
    )


@pytest.mark.parametrize(
    ("failure", "names"),
    [
        ("killed\x1b[2J", "$.shards[0].failure"),
        ("x" * (MAX_FAILURE_CHARS + 1), "$.shards[0].failure"),
    ],
)
def test_a_hostile_reason_makes_the_hello_malformed(failure: str, names: str) -> None:
    data = msgspec.json.encode(a_hello(listed_failed(None))).replace(
        b'"state":"failed"', b'"state":"failed","failure":' + msgspec.json.encode(failure)
    )

    with pytest.raises(MalformedMessage) as raised:
        decode_from_agent(data)

    assert names in str(raised.value)


class ShardReportBefore(msgspec.Struct, frozen=True, kw_only=True):
    """``ShardReport`` as control planes before the field decode it."""

    replica_id: str
    shard_index: int
    state: str


def test_an_older_control_plane_reads_a_report_with_a_reason() -> None:
    data = encode(a_hello(listed_failed("engine was killed by SIGKILL")))
    shards = msgspec.json.decode(data, type=dict[str, object])["shards"]

    [older] = msgspec.convert(shards, list[ShardReportBefore])

    assert (older.replica_id, older.state) == ("llama-1", "failed")


# -- a port another process holds --------------------------------------------------------


def test_a_failure_on_a_port_another_process_holds_reaches_the_control_plane_as_such() -> None:
    change = ShardChange(
        replica_id="llama-1",
        shard_index=0,
        state=ShardState.FAILED,
        pid=77,
        port=20000,
        error="port 20000 is held by pid 4242, not our engine (pid 4242: nc)",
        port_held_elsewhere=True,
    )
    status = shard_status(change, None)
    assert status is not None

    received = decode_from_agent(encode(status))

    assert isinstance(received, ShardStatus)
    reported = report_of(ShardStatusReported(node_id="gpu-1", status=received))
    assert isinstance(reported, ShardStatusReport)
    assert reported.phase.port_held_elsewhere


def test_a_failure_for_another_reason_is_sent_as_older_agents_send_it() -> None:
    """No ``"port_held_elsewhere": false``: the bytes an agent from before the field sent."""
    change = ShardChange(
        replica_id="llama-1",
        shard_index=0,
        state=ShardState.FAILED,
        pid=77,
        port=20000,
        error="exited with code 1",
    )
    status = shard_status(change, None)
    assert status is not None

    sent = encode(status)

    assert b"port_held_elsewhere" not in sent
    assert decode_from_agent(sent) == status


def test_an_older_agents_failure_names_no_held_port() -> None:
    """An agent from before the field sends a status without it."""
    older = (
        b'{"type":"shard_status","replica_id":"llama-1","shard_index":0,"state":"failed",'
        b'"port":20000,"error":"exited with code 1"}'
    )

    received = decode_from_agent(older)

    assert isinstance(received, ShardStatus)
    reported = report_of(ShardStatusReported(node_id="gpu-1", status=received))
    assert isinstance(reported, ShardStatusReport)
    assert not reported.phase.port_held_elsewhere
