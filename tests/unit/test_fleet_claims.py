"""What a hello may claim: the advertised address must be vouched for, the inventory true."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from app.domain.egress import EngineNetworks
from app.hub.claims import address_refusal, inventory_refusal
from wire.messages import PROTOCOL_VERSION, GpuReport, Hello, ShardReport

ANYWHERE = EngineNetworks.parse("0.0.0.0/0,::/0,gpu-7.internal,gpu-8.internal")
"""Engine networks that allow whatever is vouched for, to look at vouching alone."""


def vouched(
    advertised: str,
    *,
    remote: str = "127.0.0.1",
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> bool:
    refusal = address_refusal(
        advertised, remote_host=remote, dns_names=dns, ip_addresses=ips, engine_networks=ANYWHERE
    )
    return refusal is None


def test_the_address_the_connection_comes_from_is_vouched_for_by_the_connection() -> None:
    assert vouched("127.0.0.1")
    assert vouched("::ffff:127.0.0.1")  # the same address, IPv4-mapped
    assert vouched("[::1]", remote="::1")


def test_an_address_named_by_the_certificate_is_vouched_for_by_the_ca() -> None:
    assert vouched("10.20.0.7", ips=("10.20.0.7",))
    assert vouched("gpu-7.internal", dns=("GPU-7.Internal",))
    assert vouched("gpu-7.internal.", dns=("gpu-7.internal",))


@pytest.mark.parametrize("address", ["169.254.169.254", "127.0.0.2", "gpu-8.internal", "localhost"])
def test_anything_else_is_refused_with_what_would_have_been_accepted(address: str) -> None:
    reason = address_refusal(
        address, remote_host="127.0.0.1", dns_names=("gpu-7.internal",), ip_addresses=("10.0.0.7",)
    )
    assert reason is not None
    assert reason.startswith(f"advertised address {address!r} is neither named")
    assert "gpu-7.internal, 10.0.0.7" in reason
    assert "(127.0.0.1)" in reason


def test_a_host_name_is_never_resolved_only_compared() -> None:
    assert not vouched("localhost")  # it resolves to 127.0.0.1, the remote: still refused


def test_a_vouched_address_outside_the_engine_networks_is_refused_too() -> None:
    reason = address_refusal(
        "127.0.0.5",
        remote_host="127.0.0.1",
        dns_names=(),
        ip_addresses=("127.0.0.5",),
        engine_networks=EngineNetworks.parse("127.0.0.1/32"),
    )
    assert reason == (
        "advertised address '127.0.0.5' is outside the engine networks the gateway may "
        "contact (--engine-networks: 127.0.0.1/32)"
    )


def test_by_default_only_the_connection_s_own_address_is_within_the_engine_networks() -> None:
    named = {"dns_names": (), "ip_addresses": ("127.0.0.5",)}
    assert address_refusal("127.0.0.5", remote_host="127.0.0.1", **named) is None  # loopback
    refusal = address_refusal(
        "10.20.0.5", remote_host="10.20.0.9", dns_names=(), ip_addresses=("10.20.0.5",)
    )
    assert refusal is not None
    assert "the default of --engine-networks: 10.20.0.9/32" in refusal


def gpu(index: int, **changes: object) -> GpuReport:
    report = GpuReport(
        index=index,
        uuid=f"GPU-{index}",
        name="H100",
        memory_total_mib=81559,
        memory_used_mib=0,
        healthy=True,
    )
    return msgspec.structs.replace(report, **changes)


def shard(replica: str, index: int) -> ShardReport:
    return ShardReport(
        replica_id=replica,
        shard_index=index,
        model="m",
        port=20000,
        gpus=(0,),
        pid=1,
        state="ready",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def hello(**changes: object) -> Hello:
    base = Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id="gpu-1",
        agent_version="t",
        address="127.0.0.1",
        port_range=(20000, 20999),
        gpus=(gpu(0), gpu(1)),
    )
    return msgspec.structs.replace(base, **changes)


def test_an_ordinary_inventory_passes() -> None:
    assert inventory_refusal(hello()) is None
    assert inventory_refusal(hello(gpus=(), shards=(shard("m-1", 0), shard("m-1", 1)))) is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"gpus": (gpu(0), gpu(0, uuid="GPU-x"))}, "the hello lists GPU index 0 twice"),
        ({"gpus": (gpu(0), gpu(1, uuid="GPU-0"))}, "the hello lists GPU UUID 'GPU-0' twice"),
        ({"gpus": (gpu(0, memory_used_mib=81560),)}, "GPU 0 reports 81560 MiB used of 81559 MiB"),
        ({"gpus": (gpu(0, memory_total_mib=2**21),)}, "GPU 0 reports 2097152 MiB of memory"),
        ({"gpus": tuple(gpu(i) for i in range(65))}, "the hello lists 65 GPUs"),
        ({"shards": (shard("m-1", 0), shard("m-1", 0))}, "shard 0 of m-1 twice"),
    ],
)
def test_an_impossible_inventory_is_refused_naming_what_is_wrong(
    changes: dict[str, object], reason: str
) -> None:
    refusal = inventory_refusal(hello(**changes))
    assert refusal is not None
    assert reason in refusal
