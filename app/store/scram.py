"""A PostgreSQL SCRAM-SHA-256 password verifier, computed here (as ``psql``'s ``\\password``
does), so that setting a role's password never sends the password itself: a statement can
end up in the server's log (``log_statement``), a verifier there cannot be used to log in.

The format is PostgreSQL's (``src/common/scram-common.c``, RFC 5802 and RFC 7677):
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, base64 each. The password is
normalized with SASLprep (RFC 4013) first, as PostgreSQL and its clients do, and used as it
is where SASLprep refuses it (PostgreSQL's rule too).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stringprep
import unicodedata

ITERATIONS = 4096
"""PostgreSQL's default (``scram_iterations``)."""
SALT_BYTES = 16

_PROHIBITED = (
    stringprep.in_table_c12,
    stringprep.in_table_c21_c22,
    stringprep.in_table_c3,
    stringprep.in_table_c4,
    stringprep.in_table_c5,
    stringprep.in_table_c6,
    stringprep.in_table_c7,
    stringprep.in_table_c8,
    stringprep.in_table_c9,
    stringprep.in_table_a1,
)


def scram_sha256_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS
) -> str:
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def saslprep(text: str) -> str:
    """RFC 4013 for a stored string; ``text`` unchanged where it is not allowed."""
    mapped = "".join(
        " " if stringprep.in_table_c12(char) else char
        for char in text
        if not stringprep.in_table_b1(char)
    )
    normalized = unicodedata.normalize("NFKC", mapped)
    if any(check(char) for char in normalized for check in _PROHIBITED):
        return text
    if any(stringprep.in_table_d1(char) for char in normalized) and (
        any(stringprep.in_table_d2(char) for char in normalized)
        or not stringprep.in_table_d1(normalized[0])
        or not stringprep.in_table_d1(normalized[-1])
    ):
        return text
    return normalized


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
