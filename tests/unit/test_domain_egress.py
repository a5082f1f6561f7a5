"""Engine networks: what ``--engine-networks`` accepts, and which engine addresses it allows.

The addresses outside 127.0.0.0/8 here are deliberate (the fixture scan allows this file):
nothing dials them, they only prove that they are refused or allowed as the list says.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.egress import EngineNetworks, InvalidEngineNetworks, connection_host

PRODUCTION = "10.20.0.0/16, fd00:20::/64, 127.0.0.0/8, gpu-07.example.internal, *.gpu.internal"


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("10.20.0.7", True),
        ("10.20.255.255", True),
        ("10.21.0.7", False),
        ("10.1.0.7", False),
        ("192.168.1.10", False),
        ("127.0.0.1", True),
        ("127.45.6.7", True),
        ("::1", False),
        ("fd00:20::7", True),
        ("[fd00:20::7]", True),
        ("fd00:21::7", False),
        ("::ffff:10.20.0.7", True),
        ("::ffff:10.21.0.7", False),
        ("gpu-07.example.internal", True),
        ("GPU-07.Example.Internal.", True),
        ("gpu-08.example.internal", False),
        ("a.gpu.internal", True),
        ("rack-3.a.gpu.internal", True),
        ("gpu.internal", False),
        ("evilgpu.internal", False),
        ("", False),
        ("10.20.0.7:80", False),
        ("user@10.20.0.7", False),
        ("a.gpu.internal/x", False),
        ("a.gpu.internal:80", False),
        ("a b.gpu.internal", False),
        ("10.20", False),
        ("10.20.7", False),
        ("0x0a140007", False),
        ("169082887", False),
        ("x.0x1", False),
        ("\u0455.gpu.internal", False),  # a Cyrillic letter that looks like "s"
        ("-a.gpu.internal", False),
    ],
)
def test_an_explicit_list_allows_its_networks_and_names_and_nothing_else(
    address: str, allowed: bool
) -> None:
    assert EngineNetworks.parse(PRODUCTION).allows(address) is allowed


def test_a_network_never_admits_a_dns_name_however_it_resolves() -> None:
    everything = EngineNetworks.parse("0.0.0.0/0,::/0")

    assert everything.allows("10.9.8.7")
    assert everything.allows("2001:db8::7")
    assert not everything.allows("localhost")
    assert not everything.allows("gpu-07.example.internal")


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_is_allowed_exactly_when_a_listed_network_holds_it(
    address: ipaddress.IPv4Address,
) -> None:
    networks = EngineNetworks.parse("10.20.0.0/16,127.0.0.0/8")
    held = address in ipaddress.ip_network("10.20.0.0/16") or address.is_loopback

    assert networks.allows(str(address)) is held
    assert networks.allows(f"::ffff:{address}") is held


def test_the_list_reads_back_as_it_was_meant() -> None:
    networks = EngineNetworks.parse(
        " 10.20.0.7 ,10.20.0.0/16,::1, GPU-07.example.internal,*.gpu.internal"
    )

    assert str(networks) == (
        "10.20.0.7/32,10.20.0.0/16,::1/128,gpu-07.example.internal,*.gpu.internal"
    )
    assert EngineNetworks.parse(str(networks)) == networks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no engine networks given"),
        (" , ", "no engine networks given"),
        ("10.20.0.0/16,,127.0.0.0/8", "an empty entry"),
        ("10.20.1.0/16", "'10.20.1.0/16' has host bits set (did you mean 10.20.0.0/16?)"),
        ("10.20.0.0/33", "'10.20.0.0/33' is not an IP network"),
        ("10.20.0.0/16/8", "'10.20.0.0/16/8' is not an IP network"),
        ("10.20", "'10.20' is neither an IP network, an address nor a DNS name"),
        ("0x0a140007", "'0x0a140007' is neither"),
        ("gpu 07", "'gpu 07' is neither"),
        ("gpu-07:8000", "'gpu-07:8000' is neither"),
        ("*", "'*' is neither"),
        ("*.internal", "'*.internal' is not a wildcard over a DNS domain"),
        ("*.10.20", "'*.10.20' is not a wildcard over a DNS domain"),
        ("a.*.internal", "'a.*.internal' is neither"),
    ],
)
def test_a_list_that_cannot_be_read_is_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidEngineNetworks) as refused:
        EngineNetworks.parse(text)

    assert message in str(refused.value)


def test_every_bad_entry_is_named_at_once() -> None:
    with pytest.raises(InvalidEngineNetworks) as refused:
        EngineNetworks.parse("10.20.0.0/16,bad name,10.20.1.0/16")

    assert "'bad name'" in str(refused.value)
    assert "'10.20.1.0/16'" in str(refused.value)


@pytest.mark.parametrize(
    ("remote_address", "allowed", "refused"),
    [
        ("10.20.0.7:51234", ["10.20.0.7", "::ffff:10.20.0.7"], ["10.20.0.8", "127.0.0.1", "::1"]),
        ("[fd00:20::7]:51234", ["fd00:20::7"], ["fd00:20::8", "::1", "127.0.0.1"]),
        ("127.0.0.1:51234", ["127.0.0.1", "127.0.0.2", "::1"], ["10.20.0.7"]),
        ("[::1]:51234", ["::1", "127.0.0.1"], ["10.20.0.7"]),
        ("[::ffff:127.0.0.1]:51234", ["127.0.0.5"], ["10.20.0.7"]),
        ("", [], ["127.0.0.1", "10.20.0.7"]),
        ("unix:/run/llmgw.sock", [], ["127.0.0.1"]),
    ],
)
def test_by_default_a_node_may_be_reached_only_where_its_agent_connected_from(
    remote_address: str, allowed: list[str], refused: list[str]
) -> None:
    networks = EngineNetworks.of_connection(remote_address)

    assert [a for a in allowed if networks.allows(a)] == allowed
    assert [a for a in refused if networks.allows(a)] == []


def test_by_default_no_dns_name_is_allowed() -> None:
    assert not EngineNetworks.of_connection("10.20.0.7:51234").allows("gpu-07.example.internal")
    assert not EngineNetworks.of_connection("127.0.0.1:51234").allows("localhost")


@pytest.mark.parametrize(
    ("remote_address", "host"),
    [
        ("10.20.0.7:51234", "10.20.0.7"),
        ("[fd00:20::7]:51234", "fd00:20::7"),
        ("fd00:20::7", "fd00:20::7"),
        ("10.20.0.7", "10.20.0.7"),
        ("[fd00:20::7", ""),
    ],
)
def test_the_host_of_a_connection_address(remote_address: str, host: str) -> None:
    assert connection_host(remote_address) == host
