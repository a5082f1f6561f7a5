"""Generated and fixture data names loopback addresses only.

A database loaded with synthetic history once sent a gateway to scrape thousands of
addresses of a private network nobody meant to reach. So every address literal in the
sources and fixtures under ``benchmarks/`` and ``tests/`` must be in 127.0.0.0/8 (or be
``::1``, or an unspecified bind address such as ``0.0.0.0``): string literals in Python
files, including f-string templates whose fixed first octet is not 127 (``f"10.{n}.0.1"``),
and the whole text of any other file.

Files in ``DELIBERATELY_FOREIGN`` use other addresses on purpose, each for the reason
given; nothing in them dials those addresses.
"""

from __future__ import annotations

import io
import ipaddress
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("benchmarks", "tests")
SKIPPED_DIRECTORIES = {"__pycache__", "results", ".pytest_cache", ".hypothesis"}
DATA_SUFFIXES = {".json", ".yaml", ".yml", ".toml", ".txt", ".sql", ".csv", ".md", ".ini"}

DELIBERATELY_FOREIGN = {
    # The engine networks' own tests: foreign addresses, to prove they are refused.
    "tests/unit/test_domain_egress.py",
    "tests/unit/test_gateway_egress.py",
    # This file's tests of the scan itself.
    "tests/unit/test_fixture_addresses.py",
    # What a hello may claim: addresses a node advertises, to prove they are refused
    # (pure, or refused at hello by a real hub: never dialled).
    "tests/unit/test_fleet_claims.py",
    "tests/unit/test_fleet_session.py",
    "tests/integration/test_hub_trust.py",
    # Client addresses of the per-address authentication budget (IPv6 by /64): pure.
    "tests/unit/test_listener_throttle.py",
    # Remote addresses of the hub's cap on handshakes (IPv6 by /64, IPv4-mapped as IPv4),
    # from the documentation ranges: pure, never dialled.
    "tests/unit/test_hub_gate.py",
}

_OCTET = r"(?:\d{1,3}|\{[^{}]*\})"
IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\w)")
IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|\d{1,3}(?:\.\d{1,3}){3})?(?![\w:]|\.\w)"
)
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def foreign_addresses(text: str) -> list[str]:
    """The addresses in ``text`` outside loopback (templates whose first octet says so)."""
    found = []
    for match in IPV4.finditer(text):
        candidate = match.group(0)
        if "{" in candidate:
            first = candidate.split(".")[0]
            if first.isdigit() and first != "127":
                found.append(candidate)
            continue
        try:
            address = ipaddress.ip_address(candidate)
        except ValueError:
            continue  # 10.0.0.999 and the like: not an address
        if address not in LOOPBACK and not address.is_unspecified:
            found.append(candidate)
    for match in IPV6.finditer(text):
        candidate = match.group(0)
        try:
            address6 = ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        mapped = address6.ipv4_mapped
        if not (address6.is_loopback or address6.is_unspecified or (mapped and mapped in LOOPBACK)):
            found.append(candidate)
    return found


def literal_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal of a Python file; the whole of any other."""
    source = path.read_text(errors="replace")
    if path.suffix != ".py":
        yield from enumerate(source.splitlines(), start=1)
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING:
            yield token.start[0], token.string


def scanned_files() -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            relative = path.relative_to(ROOT)
            if SKIPPED_DIRECTORIES & set(relative.parts) or not path.is_file():
                continue
            if path.suffix == ".py" or path.suffix in DATA_SUFFIXES:
                yield path


def test_generated_and_fixture_data_name_only_loopback_addresses() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {address}"
        for path in scanned_files()
        if str(path.relative_to(ROOT)) not in DELIBERATELY_FOREIGN
        for line, text in literal_texts(path)
        for address in foreign_addresses(text)
    ]

    assert offenders == [], "use addresses in 127.0.0.0/8:\n" + "\n".join(offenders)


def test_the_allowed_foreign_files_exist() -> None:
    assert [name for name in DELIBERATELY_FOREIGN if not (ROOT / name).is_file()] == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('address="10.0.0.7"', ["10.0.0.7"]),
        ("http://192.168.1.9:8000/v1", ["192.168.1.9"]),
        ("reached 10.0.0.7. Then fd00::7.", ["10.0.0.7", "fd00::7"]),
        ('f"10.1.{n // 250}.{n % 250 + 1}"', ["10.1.{n // 250}.{n % 250 + 1}"]),
        ("10.20.0.0/16", ["10.20.0.0"]),
        ("[fd00::7]:8001", ["fd00::7"]),
        ("2001:db8::1", ["2001:db8::1"]),
        ("::ffff:10.0.0.7", ["::ffff:10.0.0.7", "10.0.0.7"]),
        ("127.0.0.1 127.45.6.7 127.{n}.0.1 0.0.0.0 :: ::1 ::ffff:127.0.0.1", []),
        ("10.0.0.999 1.2.3 v1.2.3.4a 12:30:45 ::ffff:127.0.0.9", []),
        ("{a}.{b}.{c}.{d}", []),
    ],
)
def test_the_scan_finds_foreign_addresses_and_only_those(text: str, found: list[str]) -> None:
    assert sorted(foreign_addresses(text)) == sorted(found)
