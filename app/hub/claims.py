"""What a hello may claim: pure checks of a node's word, no I/O.

A node that proved its id with its certificate is still only trusted with what it can
vouch for. Its hello is refused, with the reason, when

- the address it advertises for its engines is neither named by its certificate (a
  subject alternative name: IP address, or DNS name compared without case) nor the address
  its connection comes from: otherwise any node could point the gateway at any host, a
  metadata service say, and make it a request forwarder;
- that address is outside the engine networks (``--engine-networks``, by default the
  address the connection comes from): the gateway would refuse to contact it, so the node
  is told at once instead of its replicas never being routed;
- its inventory is not one a machine can have: more GPUs than any machine holds, two GPUs
  with one index or one UUID, more memory used than there is, sizes no GPU has, or two
  reports of one shard.

A heartbeat's GPU health changes and memory readings count only for the GPUs the
connection's hello listed, by index and UUID alike (``listed_gpu_changes``,
``listed_memory_readings``): the others are dropped, not recorded. A memory reading of more
used than the hello said the GPU has is refused, as such a hello is
(``memory_reading_refusal``).

The wire types bound every size too (``wire.messages``), so that nothing absurd is
even decoded; these checks are about meaning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.egress import EngineNetworks, host_name, ip_address_of
from wire.messages import MAX_GPUS_PER_NODE as MAX_GPUS_PER_NODE
from wire.messages import MAX_SHARDS_PER_NODE as MAX_SHARDS_PER_NODE
from wire.messages import GpuHealthChange, GpuMemoryReading, GpuReport, Hello, ShardReport

MAX_GPU_MEMORY_MIB = 1024 * 1024
"""1 TiB: several times the largest GPU memory there is."""


def address_refusal(
    advertised: str,
    *,
    remote_host: str,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    engine_networks: EngineNetworks | None = None,
) -> str | None:
    """Why ``advertised`` is not an address the node can vouch for, or one the gateway may
    contact (``engine_networks``; None: the address the connection comes from), or None
    when it is both."""
    if not _vouched(advertised, remote_host, dns_names, ip_addresses):
        named = f"the certificate names {_listed(dns_names, ip_addresses)}"
        return (
            f"advertised address {advertised!r} is neither named by the node's certificate "
            f"({named}) nor the address its connection comes from ({remote_host})"
        )
    allowed = engine_networks or EngineNetworks.of_connection(remote_host)
    if not allowed.allows(advertised):
        setting = "--engine-networks" if engine_networks else "the default of --engine-networks"
        return (
            f"advertised address {advertised!r} is outside the engine networks the gateway "
            f"may contact ({setting}: {allowed})"
        )
    return None


def inventory_refusal(hello: Hello) -> str | None:
    """Why the inventory in ``hello`` cannot be true, or None when it can."""
    return _gpu_refusal(hello.gpus) or _shard_refusal(hello.shards)


def listed_gpu_changes(
    listed: Mapping[int, str], changes: Sequence[GpuHealthChange]
) -> tuple[tuple[GpuHealthChange, ...], tuple[GpuHealthChange, ...]]:
    """``changes`` split into those of GPUs ``listed`` (index to UUID, as the hello said)
    and the others: an index the hello did not list, or a listed index with another UUID.

    An honest agent reports changes only for GPUs it listed, unless a GPU appears or
    changes places while it is connected; its next hello lists the GPU as it is then. So
    the others are dropped rather than taken as a broken connection."""
    kept = tuple(c for c in changes if listed.get(c.index) == c.uuid)
    if len(kept) == len(changes):
        return kept, ()
    return kept, tuple(c for c in changes if listed.get(c.index) != c.uuid)


def listed_memory_readings(
    listed: Mapping[int, str], readings: Sequence[GpuMemoryReading]
) -> tuple[GpuMemoryReading, ...]:
    """The ``readings`` of GPUs ``listed`` (index to UUID, as the hello said); the others
    are dropped, as ``listed_gpu_changes`` drops their health changes."""
    return tuple(r for r in readings if listed.get(r.index) == r.uuid)


def memory_reading_refusal(
    totals: Mapping[int, int], readings: Sequence[GpuMemoryReading]
) -> str | None:
    """Why ``readings`` cannot be true of GPUs of ``totals`` (index to the MiB the hello said
    each has), or None when they can: more used than the GPU has, or one GPU read twice."""
    seen: set[int] = set()
    for reading in readings:
        if reading.index in seen:
            return f"a heartbeat reads GPU {reading.index}'s memory twice"
        seen.add(reading.index)
        total = totals.get(reading.index)
        if total is not None and reading.used_mib > total:
            return f"GPU {reading.index} reports {reading.used_mib} MiB used of {total} MiB"
    return None


def _vouched(
    advertised: str, remote_host: str, dns_names: Sequence[str], ip_addresses: Sequence[str]
) -> bool:
    address = ip_address_of(advertised)
    if address is None:
        name = host_name(advertised)
        return name is not None and name in {host_name(n) for n in dns_names}
    return address in {ip_address_of(ip) for ip in ip_addresses} | {ip_address_of(remote_host)}


def _gpu_refusal(gpus: Sequence[GpuReport]) -> str | None:
    if len(gpus) > MAX_GPUS_PER_NODE:
        return f"the hello lists {len(gpus)} GPUs; a node has at most {MAX_GPUS_PER_NODE}"
    indexes: set[int] = set()
    uuids: set[str] = set()
    for gpu in gpus:
        if gpu.index in indexes:
            return f"the hello lists GPU index {gpu.index} twice"
        indexes.add(gpu.index)
        if gpu.uuid and gpu.uuid in uuids:
            return f"the hello lists GPU UUID {gpu.uuid!r} twice"
        uuids.add(gpu.uuid)
        if gpu.memory_total_mib > MAX_GPU_MEMORY_MIB:
            return (
                f"GPU {gpu.index} reports {gpu.memory_total_mib} MiB of memory; "
                f"no GPU has more than {MAX_GPU_MEMORY_MIB} MiB"
            )
        if gpu.memory_used_mib > gpu.memory_total_mib:
            return (
                f"GPU {gpu.index} reports {gpu.memory_used_mib} MiB used of "
                f"{gpu.memory_total_mib} MiB"
            )
    return None


def _shard_refusal(shards: Sequence[ShardReport]) -> str | None:
    if len(shards) > MAX_SHARDS_PER_NODE:
        return f"the hello lists {len(shards)} shards; a node runs at most {MAX_SHARDS_PER_NODE}"
    seen: set[tuple[str, int]] = set()
    for shard in shards:
        key = (shard.replica_id, shard.shard_index)
        if key in seen:
            return f"the hello lists shard {shard.shard_index} of {shard.replica_id} twice"
        seen.add(key)
    return None


def _listed(dns_names: Sequence[str], ip_addresses: Sequence[str]) -> str:
    names = [*dns_names, *ip_addresses]
    if not names:
        return "no host names or IP addresses"
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
