"""What the agent says about its GPUs and engines, and which connection failures it outlives.

The conversions are pure. The TLS failures are real: the handshakes run between two
``ssl`` objects over memory buffers, so the errors are the ones OpenSSL raises, without a
socket.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from cryptography import x509
from websockets.datastructures import Headers
from websockets.exceptions import InvalidMessage, InvalidStatus
from websockets.http11 import Response

from agent.config import AgentConfig
from agent.config_values import ServerAddress
from agent.connection import Backoff, Failure, classify_close, classify_failure
from agent.engines import ShardChange, ShardRecord, ShardState
from agent.engines.inventory import FAILED_KEPT
from agent.gpu_inventory import gpu_inventory, inventory_change
from agent.gpu_reports import (
    VANISHED_GPU_REASON,
    gpu_health_changes,
    gpu_report,
    with_vanished_gpus,
)
from agent.gpus import GpuSnapshot, GpuStatus
from agent.reports import shard_status
from agent.runtime import build_hello, shard_spec, start_refusal
from app.hub.claims import MAX_SHARDS_PER_NODE, inventory_refusal
from app.pki.builders import build_ca, issue_node, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import PrivateKey, generate_key
from app.pki.tls import client_ssl_context, server_ssl_context
from wire.errors import ProtocolError
from wire.messages import (
    GpuHealthChange,
    GpuReport,
    Heartbeat,
    ShardReport,
    StartShard,
    decode_from_agent,
    encode,
)

STARTED_AT = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)


def a_gpu(index: int, *, reason: str | None = None, xid: int | None = None) -> GpuStatus:
    return GpuStatus(
        index=index,
        uuid=f"GPU-{index}",
        name="llmgw fake GPU 80GB",
        memory_total_mib=81920,
        memory_used_mib=0,
        healthy=reason is None,
        unhealthy_reason=reason,
        xid=xid,
    )


def a_record(state: ShardState = ShardState.READY) -> ShardRecord:
    return ShardRecord(
        replica_id="m-1",
        shard_index=0,
        model="m",
        port=20001,
        gpus=(0, 1),
        command=("vllm", "serve", "m"),
        pid=4242,
        process_start_time=99,
        log_path="/var/lib/llmgw-agent/logs/m-1-0.log",
        started_at=STARTED_AT,
        state=state,
    )


def a_config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(
        servers=(ServerAddress("wss://cp:8443", "cp", 8443),),
        node_id="gpu-07",
        cert=tmp_path / "node.crt",
        key=tmp_path / "node.key",
        ca=tmp_path / "ca.crt",
        fake_gpus="2x80GB",
        state_dir=tmp_path,
        labels={"zone": "a"},
        address="127.0.0.7",
        port_range=(20000, 20999),
        log_level="info",
    )


def a_start(*, port: int = 20001, gpus: tuple[int, ...] = (0,)) -> StartShard:
    return StartShard(
        command_id="c-1",
        replica_id="m-1",
        shard_index=0,
        model="m",
        argv=("vllm", "serve", "m", "--port", str(port)),
        env={"HF_HOME": "/models"},
        gpus=gpus,
        port=port,
    )


# -- conversions -------------------------------------------------------------------------


def test_hello_carries_the_gpu_snapshot_and_every_shard(tmp_path: Path) -> None:
    hello = build_hello(
        a_config(tmp_path),
        [a_gpu(0), a_gpu(1, reason="XID 79: fallen off the bus", xid=79)],
        [a_record(ShardState.STARTING)],
    )

    assert (hello.node_id, hello.address, hello.labels) == ("gpu-07", "127.0.0.7", {"zone": "a"})
    assert hello.port_range == (20000, 20999)
    assert hello.gpus == (
        GpuReport(
            index=0,
            uuid="GPU-0",
            name="llmgw fake GPU 80GB",
            memory_total_mib=81920,
            memory_used_mib=0,
            healthy=True,
        ),
        GpuReport(
            index=1,
            uuid="GPU-1",
            name="llmgw fake GPU 80GB",
            memory_total_mib=81920,
            memory_used_mib=0,
            healthy=False,
            unhealthy_reason="XID 79: fallen off the bus",
        ),
    )
    assert hello.shards == (
        ShardReport(
            replica_id="m-1",
            shard_index=0,
            model="m",
            port=20001,
            gpus=(0, 1),
            pid=4242,
            state="starting",
            started_at=STARTED_AT,
        ),
    )


def test_a_failed_engine_becomes_a_shard_status_with_its_log_tail_and_cause() -> None:
    change = ShardChange(
        replica_id="m-1",
        shard_index=0,
        state=ShardState.FAILED,
        pid=4242,
        port=20001,
        error="engine exited with code 1",
        exit_code=1,
        log_tail=("loading weights", "CUDA out of memory"),
    )

    status = shard_status(change, "c-1")

    assert status is not None
    assert (status.state, status.pid, status.port) == ("failed", 4242, 20001)
    assert (status.error, status.exit_code) == ("engine exited with code 1", 1)
    assert status.log_tail == ("loading weights", "CUDA out of memory")
    assert status.command_id == "c-1"


def test_stopping_a_shard_the_agent_never_knew_has_no_status_to_send() -> None:
    change = ShardChange(replica_id="m-9", shard_index=0, state=ShardState.STOPPED)

    assert shard_status(change, "c-2") is None


def test_gpu_health_changes_name_only_the_gpus_that_changed() -> None:
    healthy = [a_gpu(0), a_gpu(1)]
    broken = [a_gpu(0), a_gpu(1, reason="XID 79: fallen off the bus", xid=79)]

    assert gpu_health_changes(healthy, healthy) == []
    assert gpu_health_changes(healthy, broken) == [
        GpuHealthChange(
            index=1, uuid="GPU-1", healthy=False, reason="XID 79: fallen off the bus", xid=79
        )
    ]
    assert gpu_health_changes(broken, healthy) == [
        GpuHealthChange(index=1, uuid="GPU-1", healthy=True)
    ]
    assert gpu_health_changes([], healthy) == [], "a GPU seen for the first time was healthy"


def test_a_gpu_that_drops_out_of_the_listing_is_reported_unhealthy_and_back_when_it_returns() -> (
    None
):
    """A GPU lost from the bus, or every GPU after a driver reload, may drop out of the
    listing rather than be listed unhealthy: its loss still reaches the control plane, and
    so does its return."""
    both = GpuSnapshot(gpus=(a_gpu(0), a_gpu(1)))
    one = GpuSnapshot(gpus=(a_gpu(0),))
    none = GpuSnapshot(gpus=(), unavailable_reason="NVML: driver not loaded")

    assert gpu_health_changes(both.gpus, one.gpus) == [], "the listing alone says nothing"
    lost = with_vanished_gpus(both, one)
    assert gpu_health_changes(both.gpus, lost.gpus) == [
        GpuHealthChange(index=1, uuid="GPU-1", healthy=False, reason=VANISHED_GPU_REASON)
    ]
    still_lost = with_vanished_gpus(lost, one)
    assert gpu_health_changes(lost.gpus, still_lost.gpus) == []  # said once
    back = with_vanished_gpus(still_lost, both)
    assert gpu_health_changes(still_lost.gpus, back.gpus) == [
        GpuHealthChange(index=1, uuid="GPU-1", healthy=True)
    ]

    all_gone = with_vanished_gpus(back, none)
    assert [
        (c.index, c.healthy, c.reason) for c in gpu_health_changes(back.gpus, all_gone.gpus)
    ] == [
        (0, False, f"{VANISHED_GPU_REASON}: NVML: driver not loaded"),
        (1, False, f"{VANISHED_GPU_REASON}: NVML: driver not loaded"),
    ]
    assert start_refusal(a_start(gpus=(1,)), (20000, 20999), all_gone.gpus, []) == (
        f"GPU(s) [1] are {VANISHED_GPU_REASON}"
    )


def test_only_gpus_added_or_swapped_change_the_inventory_a_hello_listed() -> None:
    """A hello no longer says which GPUs the node has once one appears or another takes its
    index; a change of health, or a GPU dropping out of the listing (kept as unhealthy),
    goes out with a heartbeat instead."""
    both = GpuSnapshot(gpus=(a_gpu(0), a_gpu(1)))
    said = gpu_inventory(both.gpus)

    assert inventory_change(gpu_inventory(()), said) == (
        "GPU inventory changed (0 listed by the hello, 2 now; added: [0, 1])"
    )
    assert inventory_change(said, gpu_inventory((a_gpu(0), a_gpu(1, reason="Xid 79")))) is None
    dropped = with_vanished_gpus(both, GpuSnapshot(gpus=(a_gpu(0),)))
    assert inventory_change(said, gpu_inventory(dropped.gpus)) is None
    swapped = (a_gpu(0), replace(a_gpu(1), uuid="GPU-other"))
    assert inventory_change(said, gpu_inventory(swapped)) == (
        "GPU inventory changed (2 listed by the hello, 2 now; another UUID: [1])"
    )


def test_an_xid_the_wire_cannot_carry_is_left_out_not_sent() -> None:
    """The control plane refuses a heartbeat with an Xid over 65535 as malformed; a driver
    (or a fake GPU's reason) that names one costs the Xid, not the connection."""
    healthy = [a_gpu(0)]
    broken = [a_gpu(0, reason="XID 99999999999: what", xid=99_999_999_999)]

    [change] = gpu_health_changes(healthy, broken)

    assert (change.healthy, change.reason, change.xid) == (False, "XID 99999999999: what", None)
    beat = Heartbeat(seq=0, gpu_changes=(change,))
    assert decode_from_agent(encode(beat)) == beat


def test_a_reason_longer_than_the_wire_carries_is_cut_not_sent_to_close_the_connection() -> None:
    """The control plane refuses a text over 1,024 characters as malformed: a GPU whose
    problems add up to more (or a fake GPU marked with a long reason) costs the tail."""
    healthy = [a_gpu(0)]
    long_reason = "; ".join(f"problem {n}: " + "x" * 60 for n in range(40))
    broken = [a_gpu(0, reason=long_reason)]

    [change] = gpu_health_changes(healthy, broken)
    beat = Heartbeat(seq=0, gpu_changes=(change,))

    assert change.reason == long_reason[:1024]
    assert decode_from_agent(encode(beat)) == beat
    assert gpu_report(broken[0]).unhealthy_reason == long_reason[:1024]


def test_a_start_command_becomes_the_spec_the_supervisor_runs() -> None:
    spec = shard_spec(a_start())

    assert spec.argv == ("vllm", "serve", "m", "--port", "20001")
    assert (spec.replica_id, spec.shard_index, spec.model) == ("m-1", 0, "m")
    assert (spec.gpus, spec.port, spec.env) == ((0,), 20001, {"HF_HOME": "/models"})


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        (a_start(), None),
        (a_start(port=8080), "port 8080 is outside this node's port range 20000-20999"),
        (a_start(gpus=(1, 5)), "GPU(s) [5] do not exist on this node (it has [0, 1])"),
        (a_start(gpus=(0, 1, 0)), "GPU(s) [0] are listed twice"),
    ],
)
def test_a_start_outside_the_ports_or_gpus_of_this_node_is_refused(
    command: StartShard, refusal: str | None
) -> None:
    assert start_refusal(command, (20000, 20999), [a_gpu(0), a_gpu(1)], []) == refusal


def a_start_of(**fields: object) -> StartShard:
    return msgspec.structs.replace(a_start(), **fields)


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        (
            a_start_of(shard_index=4096),
            "shard index 4096 is beyond what this agent can report (at most 4095)",
        ),
        (
            a_start_of(model="m" * 1025),
            "a model name of 1025 characters is longer than this agent can report (1024)",
        ),
    ],
)
def test_a_start_whose_shard_could_not_be_reported_is_refused(
    command: StartShard, refusal: str
) -> None:
    """Its engine started, every hello would list a shard the control plane cannot decode:
    the node could never connect again, nor be told to stop it."""
    assert start_refusal(command, (20000, 20999), [a_gpu(0), a_gpu(1)], []) == refusal
    record = msgspec.structs.replace(
        a_record(), shard_index=command.shard_index, model=command.model, gpus=command.gpus
    )
    hello = build_hello(a_config(Path("/var/lib/llmgw-agent")), [a_gpu(0), a_gpu(1)], [record])
    with pytest.raises(ProtocolError):
        decode_from_agent(encode(hello))


MOST_RUNNING = MAX_SHARDS_PER_NODE - FAILED_KEPT
"""Running shards, with the failed ones the agent keeps, fill a hello."""


def running_shards(count: int) -> list[ShardRecord]:
    return [
        msgspec.structs.replace(a_record(), replica_id=f"other-{n}", port=21000 + n)
        for n in range(count)
    ]


def test_a_start_past_the_shards_a_hello_may_list_is_refused() -> None:
    """With its failed shards, every one would be in the next hello: one the control plane
    refuses for listing too many shards, so the node could never connect again."""
    most = MOST_RUNNING
    assert start_refusal(a_start(), (20000, 20999), [a_gpu(0)], running_shards(most - 1)) is None
    refusal = start_refusal(a_start(), (20000, 20999), [a_gpu(0)], running_shards(most))
    assert refusal == f"this node already runs {most} shards, the most it can report"


def test_a_node_running_its_most_shards_with_its_most_failed_ones_is_still_welcomed() -> None:
    failed = [
        msgspec.structs.replace(a_record(ShardState.FAILED), replica_id=f"failed-{n}")
        for n in range(FAILED_KEPT)
    ]
    shards = running_shards(MOST_RUNNING) + failed
    hello = build_hello(a_config(Path("/var/lib/llmgw-agent")), [a_gpu(0)], shards)
    assert inventory_refusal(hello) is None


def test_a_start_on_a_port_another_running_shard_holds_is_refused() -> None:
    """Started anyway, the engine would load its model onto the GPUs and only then fail to
    bind, or be ended for the port another engine holds: refused at once, nothing runs."""
    other = msgspec.structs.replace(a_record(), replica_id="m-2", port=20001)
    refusal = start_refusal(a_start(port=20001), (20000, 20999), [a_gpu(0)], [other])
    assert refusal == "port 20001 is already used by replica m-2 shard 0 (pid 4242)"


@pytest.mark.parametrize("state", [ShardState.FAILED, ShardState.STOPPED])
def test_a_port_of_a_shard_that_no_longer_runs_is_free(state: ShardState) -> None:
    ended = msgspec.structs.replace(a_record(state), replica_id="m-2", port=20001)
    assert start_refusal(a_start(port=20001), (20000, 20999), [a_gpu(0)], [ended]) is None


def test_a_start_of_the_shard_already_on_that_port_is_not_refused() -> None:
    """The same shard started again is an idempotent start, answered by the supervisor."""
    assert start_refusal(a_start(port=20001), (20000, 20999), [a_gpu(0)], [a_record()]) is None


# -- which failures are fatal ------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw CA", now, 1)
    stranger = build_ca(generate_key(), "llmgw CA", now, 1)
    write_ca(directory, ca, force=False)
    loopback, elsewhere = ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("127.0.0.2")
    issuers: dict[str, Callable[[PrivateKey], x509.Certificate]] = {
        "server": lambda key: issue_server(ca, key, [], [loopback], now, 1),
        "server-elsewhere": lambda key: issue_server(ca, key, [], [elsewhere], now, 1),
        "node": lambda key: issue_node(ca, key, "gpu-07", now, 1),
        "node-stranger": lambda key: issue_node(stranger, key, "gpu-07", now, 1),
    }
    for stem, issue in issuers.items():
        key = generate_key()
        write_issued(directory, stem, issue(key), key, force=False)
    return directory


def tls_failure(pki: Path, server: str, client: str | None) -> ssl.SSLError | None:
    """The error the client side of a handshake with ``server`` raises, if any, read as a
    client does: the handshake first, then the server's first answer (TLS 1.3 servers check
    the client certificate after the client has finished)."""
    server_side = server_ssl_context(pki / f"{server}.crt", pki / f"{server}.key", pki / "ca.crt")
    client_side = client_ssl_context(
        pki / "ca.crt",
        None if client is None else pki / f"{client}.crt",
        None if client is None else pki / f"{client}.key",
    )
    to_client, from_client, to_server, from_server = (ssl.MemoryBIO() for _ in range(4))
    client_tls = client_side.wrap_bio(to_client, from_client, server_hostname="127.0.0.1")
    server_tls = server_side.wrap_bio(to_server, from_server, server_side=True)
    client_done = server_done = False
    for _ in range(10):
        try:
            if client_done:
                client_tls.read()
            else:
                client_tls.do_handshake()
                client_done = True
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            return exc
        to_server.write(from_client.read())
        try:
            if not server_done:
                server_tls.do_handshake()
                server_done = True
        except (ssl.SSLWantReadError, ssl.SSLError):
            pass  # the server's refusal travels to the client as an alert
        to_client.write(from_server.read())
    return None


def test_the_handshakes_of_a_good_certificate_pair_succeed(pki: Path) -> None:
    assert tls_failure(pki, "server", "node") is None


def test_a_server_certificate_without_the_dialled_ip_is_fatal(pki: Path) -> None:
    failure = tls_failure(pki, "server-elsewhere", "node")

    assert isinstance(failure, ssl.SSLCertVerificationError)
    assert classify_failure(failure) is Failure.SERVER_CERTIFICATE


@pytest.mark.parametrize("client", ["node-stranger", None])
def test_a_client_certificate_the_server_refuses_with_an_alert_is_fatal(
    pki: Path, client: str | None
) -> None:
    failure = tls_failure(pki, "server", client)

    assert failure is not None
    assert classify_failure(failure) is Failure.CLIENT_REFUSED
    wrapped = OSError("connection failed")
    wrapped.__cause__ = failure
    assert classify_failure(wrapped) is Failure.CLIENT_REFUSED, "found up the cause chain"


@pytest.mark.parametrize(
    ("status", "failure"),
    [(403, Failure.CLIENT_REFUSED), (401, Failure.CLIENT_REFUSED), (503, Failure.RETRYABLE)],
)
def test_an_http_refusal_is_fatal_and_a_server_error_is_not(status: int, failure: Failure) -> None:
    exc = InvalidStatus(Response(status, "", Headers()))

    assert classify_failure(exc) is failure


def test_a_hang_up_before_the_http_answer_is_retried_but_counted() -> None:
    hang_up = InvalidMessage("did not receive a valid HTTP response")
    hang_up.__cause__ = EOFError("connection closed while reading HTTP status line")

    assert classify_failure(hang_up) is Failure.HUNG_UP_AFTER_TLS


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out during opening handshake"),
        OSError(113, "No route to host"),
    ],
)
def test_network_failures_are_retried(exc: Exception) -> None:
    assert classify_failure(exc) is Failure.RETRYABLE


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        (1008, Failure.CLIENT_REFUSED),
        (1001, Failure.RETRYABLE),
        (1011, Failure.RETRYABLE),
        (4001, Failure.RETRYABLE),
        (4002, Failure.RETRYABLE),
        (4004, Failure.TOO_OFTEN),
        (4005, Failure.CONNECTED_ELSEWHERE),
        (4099, Failure.RETRYABLE),  # a code this agent does not know: it reconnects later
    ],
)
def test_only_a_policy_close_by_the_server_is_fatal(code: int, failure: Failure) -> None:
    assert classify_close(code) is failure


def test_the_longest_delay_is_drawn_from_the_upper_half_of_the_cap_at_any_step() -> None:
    highest = Backoff(initial_s=0.5, cap_s=30.0, uniform=lambda: 1.0)
    lowest = Backoff(initial_s=0.5, cap_s=30.0, uniform=lambda: 0.0)

    assert (highest.longest_delay(), lowest.longest_delay()) == (30.0, 15.0)
    assert highest.next_delay() == 0.5, "the longest delay takes no step"


def test_backoff_doubles_with_jitter_up_to_its_cap_and_starts_over_when_reset() -> None:
    highest = Backoff(initial_s=0.5, cap_s=30.0, uniform=lambda: 1.0)
    lowest = Backoff(initial_s=0.5, cap_s=30.0, uniform=lambda: 0.0)

    assert [highest.next_delay() for _ in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [lowest.next_delay() for _ in range(3)] == [0.25, 0.5, 1]
    highest.reset()
    assert highest.next_delay() == 0.5


def test_backoff_stays_at_its_cap_however_long_the_control_plane_is_away() -> None:
    """At the default cap a delay is 15-30 s: 1,100 failures in a row are about nine hours
    of a control plane that is down, which the agent must outlive."""
    backoff = Backoff(initial_s=0.5, cap_s=30.0, uniform=lambda: 1.0)

    delays = [backoff.next_delay() for _ in range(1_100)]

    assert delays[-1] == 30.0
    backoff.reset()
    assert backoff.next_delay() == 0.5
