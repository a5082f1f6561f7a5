"""The addresses ``llmgw-cli cert`` puts into a certificate: each flag refuses the other's
kind of address, saying which flag takes it."""

from __future__ import annotations

import pytest

from app.pki.errors import InvalidRequest
from app.pki.names import check_host, parse_ip


def test_a_host_name_given_as_an_ip_address_is_refused_naming_the_host_flag() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_ip("llmgw.internal")
    assert str(refused.value) == (
        "'llmgw.internal' is a host name, not an IP address: pass it with --host so that "
        "clients dialling it can verify the certificate"
    )


@pytest.mark.parametrize("text", ["127.0.0.999", "127.0.0", "-x", "a b"])
def test_what_is_neither_an_ip_address_nor_a_host_name_is_an_invalid_ip_address(
    text: str,
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_ip(text)
    assert str(refused.value) == f"invalid IP address {text!r}"


def test_an_ip_address_given_as_a_host_name_is_refused_naming_the_ip_flag() -> None:
    with pytest.raises(InvalidRequest, match=r"'127\.0\.0\.5' is an IP address, not a host name: "):
        check_host("127.0.0.5")
