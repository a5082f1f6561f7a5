"""The runtime role's password is sent as a SCRAM-SHA-256 verifier in PostgreSQL's format,
the password normalized as RFC 4013 says (and as PostgreSQL does), or kept as it is where
RFC 4013 refuses it. That PostgreSQL accepts the verifier for a login is shown against a
real server in tests/integration/test_migrate_runtime_role.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest

from app.store.scram import saslprep, scram_sha256_verifier


@pytest.mark.parametrize(
    ("given", "prepared"),
    [
        ("I\u00adX", "IX"),  # soft hyphen is mapped to nothing
        ("user", "user"),
        ("USER", "USER"),  # no case folding
        ("\u00aa", "a"),  # NFKC
        ("\u2168", "IX"),
        ("a\u00a0b", "a b"),  # non-ASCII space becomes a space
        ("\u0007", "\u0007"),  # prohibited: kept as it is
        ("\u0627\u0031", "\u0627\u0031"),  # bidi rule broken: kept as it is
    ],
)
def test_saslprep_follows_rfc_4013_section_3(given: str, prepared: str) -> None:
    assert saslprep(given) == prepared


def test_the_verifier_has_postgresql_format_and_keys() -> None:
    salt = bytes(range(16))

    verifier = scram_sha256_verifier("pencil", salt=salt, iterations=4096)

    match = re.fullmatch(r"SCRAM-SHA-256\$4096:([^$]+)\$([^:]+):(.+)", verifier)
    assert match is not None, verifier
    assert base64.b64decode(match[1]) == salt
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    assert base64.b64decode(match[2]) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(match[3]) == hmac.digest(salted, b"Server Key", "sha256")


def test_every_verifier_has_a_salt_of_its_own() -> None:
    assert scram_sha256_verifier("same") != scram_sha256_verifier("same")
