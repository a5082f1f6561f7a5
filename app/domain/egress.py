"""Where engines may live: the addresses the gateway may contact, and a node may advertise.

``EngineNetworks`` is what ``--engine-networks`` (``LLMGW_ENGINE_NETWORKS``) says, a
comma-separated list whose entries are each

- an IP network in CIDR form (``10.20.0.0/16``, ``fd00:20::/64``) or one address
  (``10.20.0.7``, ``::1``);
- a DNS name (``gpu-07.example.internal``), or every name below a domain
  (``*.gpu.example.internal``, which does not admit ``gpu.example.internal`` itself).

**Names.** A network never admits a DNS name, however the name resolves: the answer is
whoever runs that DNS's to give, it can differ between a check and the connection that
follows, and a node chooses the name it advertises. A name is allowed only when it, or its
domain, is listed; the operator who lists it trusts that name's DNS. Anything that is
neither an IP address nor a well-formed host name is never allowed: a port, user info, a
path, spaces, or a numeric shorthand that resolvers read as IPv4 (``10.1``,
``0x0a000001``, ``167772161``).

**The default**, when no list is given, is per node: ``of_connection(remote_address)``
allows only the address its agent's connection came from (the remote address the hub
recorded for the node), and every loopback address when that connection came over
loopback. A node that advertises a DNS name, or an address other than the one it connects
from (a second network for engine traffic), needs the list.

Addresses are compared as IP addresses: ``::ffff:10.0.0.7`` is ``10.0.0.7``, and an IPv6
zone (``fe80::7%eth0``) does not change which networks hold it.

Raises ``InvalidEngineNetworks`` (a ``ValueError``) naming every entry it cannot read.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK_NETWORKS: tuple[IpNetwork, ...] = (
    ipaddress.IPv4Network("127.0.0.0/8"),
    ipaddress.IPv6Network("::1/128"),
)
MAX_NAME_LENGTH = 253
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")


class InvalidEngineNetworks(ValueError):
    """The text is not a list of engine networks; the message names every bad entry."""


@dataclass(frozen=True)
class EngineNetworks:
    networks: tuple[IpNetwork, ...] = ()
    names: frozenset[str] = frozenset()
    """DNS names allowed as they are (lower case, without a final dot)."""
    domains: tuple[str, ...] = ()
    """``.example.internal`` for ``*.example.internal``: every name that ends with it."""

    @classmethod
    def parse(cls, text: str) -> EngineNetworks:
        """The list in ``text``: entries separated by commas (spaces around them are
        ignored). Empty text is an error: allowing nothing is never what was meant."""
        entries = [entry.strip() for entry in text.split(",")]
        if not any(entries):
            raise InvalidEngineNetworks(
                "no engine networks given: list networks, addresses or DNS names, e.g. "
                "10.20.0.0/16,127.0.0.0/8"
            )
        networks: list[IpNetwork] = []
        names: set[str] = set()
        domains: list[str] = []
        problems: list[str] = []
        for entry in entries:
            problem = None
            if not entry:
                problem = "an empty entry (two commas in a row?)"
            elif entry.startswith("*."):
                domain = host_name(entry[2:])
                if domain is None or "." not in domain or _looks_numeric(domain):
                    problem = f"{entry!r} is not a wildcard over a DNS domain"
                else:
                    domains.append(f".{domain}")
            elif "/" in entry:
                network, problem = _cidr(entry)
                if network is not None:
                    networks.append(network)
            elif (address := ip_address_of(entry)) is not None:
                networks.append(_only(address))
            elif (name := host_name(entry)) is not None and not _looks_numeric(entry):
                names.add(name)
            else:
                problem = f"{entry!r} is neither an IP network, an address nor a DNS name"
            if problem is not None:
                problems.append(problem)
        if problems:
            raise InvalidEngineNetworks("invalid engine networks: " + "; ".join(problems))
        return cls(tuple(dict.fromkeys(networks)), frozenset(names), tuple(dict.fromkeys(domains)))

    @classmethod
    def of_connection(cls, remote_address: str) -> EngineNetworks:
        """The default for one node: the address its agent connected from (``host:port``
        or ``[v6]:port`` as the hub records it), plus loopback if that is loopback. Nothing
        when the connection's address is unknown."""
        address = ip_address_of(connection_host(remote_address))
        if address is None:
            return cls()
        own = _only(address)
        return cls((own, *LOOPBACK_NETWORKS) if address.is_loopback else (own,))

    def allows(self, address: str) -> bool:
        """Whether an engine at ``address`` (an IP address or a DNS name, as a node
        advertises it) may be contacted."""
        ip = ip_address_of(address)
        if ip is not None:
            return any(ip in network for network in self.networks)
        if _looks_numeric(address):
            return False
        name = host_name(address)
        if name is None:
            return False
        return name in self.names or any(name.endswith(domain) for domain in self.domains)

    def __str__(self) -> str:
        entries = [str(network) for network in self.networks]
        entries += sorted(self.names)
        entries += [f"*{domain}" for domain in self.domains]
        return ",".join(entries) or "nothing"


def connection_host(remote_address: str) -> str:
    """The host of ``host:port``, ``[v6]:port``, or of an address without a port."""
    text = remote_address.strip()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else ""
    if text.count(":") == 1:
        return text.partition(":")[0]
    return text


def ip_address_of(text: str) -> IpAddress | None:
    """``text`` as an IP address (IPv4-mapped IPv6 as IPv4, brackets allowed around IPv6),
    or None when it is not one."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def host_name(text: str) -> str | None:
    """``text`` as a DNS host name (lower case, without a final dot), or None when it is
    not one: letters, digits and hyphens only, labels of 1 to 63 characters."""
    name = text.lower()
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > MAX_NAME_LENGTH or not name.isascii():
        return None
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return None
    return name


def _looks_numeric(text: str) -> bool:
    """A last label of digits or hex (``10.1``, ``0x0a000001``) is read as IPv4 by
    resolvers (inet_aton), so such a text is never taken for a name."""
    last = text.lower().rstrip(".").rpartition(".")[2]
    return bool(_NUMERIC_LABEL.fullmatch(last))


def _only(address: IpAddress) -> IpNetwork:
    """The network of just ``address`` (without its IPv6 zone, which is no part of it)."""
    if isinstance(address, ipaddress.IPv6Address):
        return ipaddress.IPv6Network(ipaddress.IPv6Address(int(address)))
    return ipaddress.IPv4Network(address)


def _cidr(entry: str) -> tuple[IpNetwork | None, str | None]:
    """``entry`` as a network, or why it is not one: host bits set is a mistake to name,
    not a network to guess."""
    try:
        return ipaddress.ip_network(entry), None
    except ValueError:
        pass
    try:
        meant = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None, f"{entry!r} is not an IP network"
    return None, f"{entry!r} has host bits set (did you mean {meant}?)"
